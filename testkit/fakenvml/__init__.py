"""The fake ``libnvidia-ml.so.1`` (``fakenvml.c``) and its builder (``build.py``), shared by
the tests (``tests/conftest.py``) and the benchmarks (``bench/benchlib.py``)."""
