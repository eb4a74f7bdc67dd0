"""Where stages run: cluster descriptions, worker processes, device layout.

* ``cluster_spec``: the worker tasks of a cluster, from ``worker=h:p,...``,
  a JSON cluster dict, ``TF_CONFIG`` or Slurm;
* ``worker``: the worker binary (``python -m gpipe.worker``);
* ``local_cluster``: K worker processes on this host (``LocalCluster``),
  forks of one fork server that imported TensorFlow once
  (``forked_workers``; ``fork_server`` is that server; ``child_env``: the
  environment of a child process that imports this repository);
* ``liveness``: whether the TensorFlow server at an address answers (the
  one liveness check of the library, the trainer and the tests);
* ``devices``: asking a running cluster for its devices;
* ``session_cluster``: a session over any set of running servers, numbered
  by the session (the servers that still serve after one is lost, or one
  back at a new address), each session's state kept apart;
* ``layout``: R replicas x K stages on the tasks' devices;
* ``tpu_layout``: R replicas x K stages on a TPU slice's cores (a pure
  function checked against TensorFlow's DeviceAssignment; nothing runs on
  TPU cores yet, docs/TPU.md);
* ``memory_cap``: a memory cap per worker process;
* ``cpu_quota``: a CPU quota for running processes (a throttled worker);
* ``cgroups``: the Linux cgroup v1 controllers both use;
* ``netns``: joining a Linux network namespace (setns), for a process
  forked into a host of a lab or a thread of its own;
* ``background``: work in a thread of its own (a session run watched
  while it runs), its value or error kept; ``RunIsolated`` for layers built
  outside the one Lingvo is constructing (counting, timing, profiling).

Layer 1 (``gpipe/__init__.py`` has the map): it imports ``compat/`` and
``schedules/`` (the placement rules), never ``measure/`` or the executor.
"""
