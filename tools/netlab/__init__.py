"""Several hosts on one machine, for tests and benchmarks.

* ``netns``: hosts as Linux network namespaces on one bridge, TensorFlow
  workers in them, bandwidth caps, partitions, clean-up;
* ``delay_relay``: a TCP relay that delays every byte by a fixed one-way
  time (link latency without the kernel's netem qdisc).
"""
