"""The pipeline's stage entry points, one module per dvc.yaml stage, run as `python -m stages.<name>`."""
