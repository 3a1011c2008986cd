"""Code shared by the test folders (importable because pytest puts tests/ on sys.path)."""
