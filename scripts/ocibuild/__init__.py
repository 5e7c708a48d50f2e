"""A small reproducible OCI image builder: no daemon, no registry (``python -m ocibuild``, see docs/images.md).

Images are a Debian base made by mmdebstrap plus layers cut from one virtualenv by Python distribution.
Every layer is an uncompressed tar with sorted entries, fixed mtimes and no host paths, so the same inputs
give the same digests.

Why written here rather than driving buildah: the image format is only tar and JSON, and writing it directly
puts everything that decides a digest (entry order, mtimes, owners, modes, hardlinks) in one place, with no
storage driver, container runtime or base image from a registry. The Debian part is mmdebstrap's; umoci,
skopeo and containerd read the result in the tests and docs/images.md.
"""
