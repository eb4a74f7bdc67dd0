r"""GPipe's Tables 1-3 at the scale of a 2-core CPU, beside Lingvo's GPipe.

Usage (from the repository root; or ``bazel run //tools/benchmark -- ...``)::

  .venv/bin/python -m tools.benchmark throughput --json t.json --plot t.png
  .venv/bin/python -m tools.benchmark memory --json m.json --plot m.png
  .venv/bin/python -m tools.benchmark bubble --json b.json --plot b.png
  .venv/bin/python -m tools.benchmark graph --json g.json --plot g.png

Subcommands:

  throughput  Training steps/s of a Transformer stack and an AmoebaNet-D-like
              stack for K in {1, 2} stages (one pinned one-core worker
              process each) and M micro-batches, normalized to K=1, M=1 with
              the same remat mode (like the paper's Table 2); beside it, on
              the same layers, K, M and cores, Lingvo's GPipe (one process
              with K virtual CPUs, all cores' threads) and plain TensorFlow
              (no pipeline, all cores). Also ours with v > 1 stages per
              device (2v stages looped over the 2 workers, breadth-first).
              All configurations are timed interleaved in one run.
  memory      Table 1: under one per-device memory cap, the most layers of
              each model that take a training step as naive-1 (no pipeline,
              no remat), pipeline-1 (remat, M micro-batches) and pipeline-2,
              from the measured peak memory of traced steps.
  bubble      Measured idle fraction of each stage (execution traces) vs the
              fill-drain model (K-1)/(M+K-1), and a timeline picture.
  graph       Graph build time and op count as M and L grow (no session).
  schedules   Fill-drain, 1F1B, interleaved 1F1B, ZB-H1 and ZB-V side by
              side: step time, measured bubble, peak memory, timelines.
  cost        Where a pipeline step's time goes per micro-batch (traced op
              time by kind), batched weight gradients beside the default,
              and for the dense workload the kernel floor: each stage's work
              as plain TensorFlow ops with no pipeline, and the K=2 ceiling
              it leaves.
  data_parallel  R replicas x K stages beside R=1: speed-up and the
              all-reduce's share of the step.
  links       K stages on K hosts (network namespaces, as root) whose links
              are capped and delayed by 0, 1 and 5 ms: step time per
              schedule and M, and how much of the link each one hides.
  decode      Pipelined decoding of a Transformer (greedy and beam search):
              sentences/s and per-token latency for K in {1, 2} pinned
              one-core workers and M lanes, beside the unpipelined decoder;
              measured bubble beside the lane schedule's formula. With
              --memory_cap: a model too big for one worker under that cap
              decoded on K capped workers (peak memory per worker).
  plan        The planner (gpipe.plan) checked: each stack profiled on one
              pinned core, its top configurations for the two workers
              under a memory cap run beside K=1, M=1 and the zero-bubble
              schedules; predicted vs measured step time and peak memory.
  startup     Where a pipelined trainer's start-up goes (16 workers of
              mt.T64Structure_Numbers by default): seconds and memory of
              each phase up to the second step, beside another checkout's
              trainer (--before) in the same run.
  xla_trainer The trainer with --xla beside without, per registered model
              and schedule: first-step loss and gradient norm, later losses
              beside the uncompiled schedules' own float32 spread, step
              time, and the decode outputs.

Every subcommand prints a markdown table, the machine and the settings, and
writes ``--json`` and ``--plot`` if given. ``--quick`` runs a tiny version
(for tests). ``--priority N`` raises the worker processes' scheduling
priority (Linux autogroup niceness -N; root): on a machine shared with other
work, pipelined stages otherwise get only part of their cores.

Modules: ``cli`` (flags and dispatch), one per subcommand (``throughput``,
``memory``, ``bubble``, ``graph``, ``schedules``, ``cost``,
``data_parallel``, ``links``, ``decode``, ``plan``, ``startup``), ``floor`` (the kernel
floor ``cost`` reports),
``report`` (their tables, header, JSON and plots), ``runner``
(configurations, worker clusters, timed steps), ``models`` (the benchmark
layer stacks) and ``lingvo_stack`` (Lingvo's GPipeTransformerStack).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import  # must be first
from tools.benchmark.bubble import Bubble
from tools.benchmark.cli import main
from tools.benchmark.graph import Graph
from tools.benchmark.memory import LargestFitting
from tools.benchmark.memory import Memory
from tools.benchmark.throughput import Throughput
