//! libibjitter.so — the LD_PRELOAD latency injector.
