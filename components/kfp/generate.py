"""Regenerate components/yaml/*.yaml (same as ``python -m trainflow.kfp.compile``)."""

from trainflow.kfp.compile import main

if __name__ == "__main__":
    main()
