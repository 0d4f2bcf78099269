"""vq's version, in a module of its own so that the kernels can key their cache on it without
importing the package they sit under."""

__version__ = "0.1.0"
