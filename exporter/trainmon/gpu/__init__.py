"""The GPU source: NVML through the official ``nvidia-ml-py`` bindings.

- ``nvml.py``: the facade, the only module that imports ``pynvml``; one error policy;
- ``types.py``: the readings it returns and its exceptions (``GPULost``, ``NVMLUnavailable``);
- ``events.py``: the XID event listener thread;
- ``sampler.py``: the high-rate utilization sampler behind the sawtooth metrics.
"""
