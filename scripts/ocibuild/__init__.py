"""A small reproducible OCI image builder: no daemon, no registry (``python -m ocibuild``, see docs/images.md).

Images are a Debian base made by mmdebstrap plus layers cut from one virtualenv by Python distribution.
Every layer is an uncompressed tar with sorted entries, fixed mtimes and no host paths, so the same inputs
give the same digests.
"""
