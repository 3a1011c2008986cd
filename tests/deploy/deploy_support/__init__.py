"""Helpers of the deployment tests: a minimal kustomize, a Containerfile runner, CRD schemas.

Imported as ``tests.deploy.deploy_support`` (``deploy`` alone is the repository's deploy/).
"""
