"""Helpers of the deployment tests: a minimal kustomize, a Containerfile runner, CRD schemas.

Importable as ``deploytest`` because tests/deploy/conftest.py puts its folder
on ``sys.path`` (the name ``deploy`` belongs to the repository's deploy/).
"""
