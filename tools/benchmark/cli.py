"""The benchmark's command line: flags, ``--quick`` sizes and dispatch.

``main`` parses the subcommand and its flags (``--help`` lists them), shrinks
the defaults for ``--quick`` and runs one of ``throughput.Throughput``,
``memory.Memory``, ``bubble.Bubble``, ``schedules.Schedules``,
``data_parallel.DataParallel``, ``graph.Graph``, ``links.Links``,
``decode.Decode`` (``decode_memory.MemoryCap`` with ``--memory_cap``),
``plan.Plan``, ``plan_trainer.PlanTrainer``, ``startup.Startup``,
``xla_trainer.XlaTrainer`` or ``elastic.Elastic``.
"""

import argparse
import os
import sys

from gpipe import pipeline
from tools.benchmark import bubble
from tools.benchmark import cost
from tools.benchmark import data_parallel
from tools.benchmark import decode
from tools.benchmark import decode_memory
from tools.benchmark import elastic
from tools.benchmark import graph
from tools.benchmark import links
from tools.benchmark import memory
from tools.benchmark import plan
from tools.benchmark import plan_trainer
from tools.benchmark import schedules
from tools.benchmark import startup
from tools.benchmark import throughput
from tools.benchmark import xla_trainer


_ELASTIC_SCENARIOS = 'loss_and_return,restart,throttled'


def _Parser():
  """The parser of the subcommands and their flags."""
  # The description is the first line of the package's docstring.
  parser = argparse.ArgumentParser(
      prog='python -m tools.benchmark',
      description=sys.modules[__package__].__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)

  def Common(p):
    p.add_argument('--json', help='write the results to this JSON file')
    p.add_argument('--plot', help='write a PNG plot to this file')
    p.add_argument('--quick', action='store_true',
                   help='tiny sizes and few steps (for tests)')
    p.add_argument('--priority', type=int, default=0,
                   help='raise worker priority by N (Linux autogroup '
                   'niceness -N, needs root); 0 leaves it alone')

  def TrainerRuns(p, models):
    """The flags of a subcommand that runs the trainer on registered models."""
    p.add_argument('--models', default='',
                   help='comma-separated registered models (default: %s)' %
                   ','.join(models))
    p.add_argument('--timeout_secs', type=int, default=1800,
                   help='stop a trainer run that takes longer than this')

  p = sub.add_parser('throughput', help=throughput.Throughput.__doc__)
  Common(p)
  p.add_argument('--models', default='',
                 help='comma-separated subset of transformer,amoeba,dense,'
                 'lingvo_stack (Lingvo\'s GPipeTransformerStack on both '
                 'executors)')
  p.add_argument('--micro_batches', default='1,4,8,32')
  p.add_argument('--fprop_dtypes', default='float32',
                 help="e.g. 'float32,bfloat16': also time ours at K=1 M=1, "
                 'K=1 M=8 and K=2 M=8 in each dtype (bfloat16: mixed '
                 'precision) and print their table')
  p.add_argument('--references', default=True,
                 action=argparse.BooleanOptionalAction,
                 help="time Lingvo's GPipe, plain TF and the inline "
                 'micro-batches beside ours (--no-references: ours only)')
  p.add_argument('--lingvo_micro_batches', default='',
                 help="M values for Lingvo's GPipe (default: --micro_batches)")
  p.add_argument('--stages_per_device', default='1,2,4',
                 help='v values for ours at K=2: v > 1 puts 2v stages on the '
                 'two devices in a loop (run at --loop_micro_batches)')
  p.add_argument('--loop_micro_batches', default='8')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--xla', action='store_true',
                 help="also time each of ours with compile='xla' (every "
                 'stage function compiled by XLA): step time, first step '
                 'and graph size side by side')
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)

  p = sub.add_parser('memory', help=memory.Memory.__doc__)
  Common(p)
  p.add_argument('--models', default='')
  p.add_argument('--cap_mib', type=float, default=256.0,
                 help='per-device memory cap (MiB)')
  p.add_argument('--max_layers', type=int, default=96)
  p.add_argument('--micro_batches', type=int, default=8,
                 help='M of pipeline-1 and pipeline-2')

  p = sub.add_parser('bubble', help=bubble.Bubble.__doc__)
  Common(p)
  p.add_argument('--model', default='transformer',
                 choices=sorted(throughput.THROUGHPUT_MODELS))
  p.add_argument('--micro_batches', default='1,2,4,8,16,32')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=3,
                 help='traced steps per M (the median is reported)')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--stages_per_device', type=int, default=1,
                 help='v: 2v stages looped over the 2 workers (bubble per '
                 'device then)')
  p.add_argument('--timeline', help='write the timeline PNG of one M here')
  p.add_argument('--timeline_m', type=int, default=8)

  p = sub.add_parser('schedules', help=schedules.Schedules.__doc__)
  Common(p)
  p.add_argument('--models', default='',
                 help='comma-separated subset of transformer,amoeba,'
                 'lingvo_stack (Lingvo\'s GPipeTransformerStack on both '
                 'executors)')
  p.add_argument('--micro_batches', default='1,2,4,8,16,32')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--trace_steps', type=int, default=3,
                 help='traced steps per configuration (median bubble)')
  p.add_argument('--memory_m', type=int, default=16,
                 help='M of the remat=never memory comparison (0: skip)')
  p.add_argument('--timeline_dir',
                 help='write one timeline PNG per schedule and model here')
  p.add_argument('--timeline_m', type=int, default=8)

  p = sub.add_parser('cost', help=cost.Cost.__doc__)
  Common(p)
  p.add_argument('--model', default='dense',
                 choices=sorted(throughput.THROUGHPUT_MODELS))
  p.add_argument('--num_stages', type=int, default=2)
  p.add_argument('--micro_batches', default='32',
                 help='comma-separated M values (all timed interleaved)')
  p.add_argument('--remat', default='never', choices=pipeline.REMAT_MODES)
  p.add_argument('--fprop_dtype', default='float32')
  p.add_argument('--batched_weight_gradients', default=True,
                 action=argparse.BooleanOptionalAction,
                 help='also run K x M with batched weight gradients (one W '
                 'task per stage) beside the default')
  p.add_argument('--floor', default=True,
                 action=argparse.BooleanOptionalAction,
                 help='dense, float32: also measure the kernel floor (each '
                 "stage's work as plain TF ops, no pipeline) and the K=2 "
                 'ceiling it leaves (tools/benchmark/floor.py)')
  p.add_argument('--steps', type=int, default=3,
                 help='timed and traced steps per configuration (median)')
  p.add_argument('--warmup', type=int, default=2)
  p = sub.add_parser('data_parallel', help=data_parallel.DataParallel.__doc__)
  p.add_argument('--models', default='',
                 help='comma-separated: transformer,amoeba (default both)')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--trace_steps', type=int, default=3,
                 help='traced steps per configuration (all-reduce share)')
  Common(p)

  p = sub.add_parser('graph', help=graph.Graph.__doc__)
  Common(p)

  p = sub.add_parser('links', help=links.Links.__doc__)
  Common(p)
  p.add_argument('--model', default='transformer',
                 choices=['transformer', 'amoeba', 'dense'])
  p.add_argument('--num_layers', type=int, default=0,
                 help='layers (default %d)' % links.SHAPE['num_layers'])
  p.add_argument('--batch', type=int, default=0,
                 help='mini-batch (default %d)' % links.SHAPE['batch'])
  p.add_argument('--width', type=int, default=0,
                 help='model width (default %d)' % links.SHAPE['width'])
  p.add_argument('--num_stages', default='2,4',
                 help='K values: one host (network namespace) per stage')
  p.add_argument('--schedules', default='gpipe,1f1b,zb_h1',
                 help='schedules with one stage per device')
  p.add_argument('--micro_batches', default='4,8,16')
  p.add_argument('--delays_ms', default='0,1,5',
                 help='one-way delays added to every link (0 is always run)')
  p.add_argument('--rate_mbit', type=float, default=1000.0,
                 help='every link capped at this rate each way (tbf)')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)
  p = sub.add_parser('decode', help=decode.Decode.__doc__)
  Common(p)
  p.add_argument('--lanes', default='1,2,4,8',
                 help='M values of the pipelined decoder (lanes)')
  p.add_argument('--beams', default='1,4',
                 help='beam sizes (1: greedy decoding)')
  p.add_argument('--whole_layer_lanes', default='2',
                 help='M values at which K=2 also decodes with the decoder '
                 'cut at whole layers, beside the cut into step parts '
                 "(comma-separated; '' for none)")
  p.add_argument('--batch', type=int, default=256,
                 help='sentences decoded together, greedy (a serving '
                 'batch: lanes of 32-256 rows)')
  p.add_argument('--beam_batch', type=int, default=64,
                 help='sentences decoded together with beam search (x beams '
                 'rows: as many rows as --batch with beam 4)')
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--trace_steps', type=int, default=3,
                 help='traced decodes per pipelined configuration (median '
                 'bubble)')
  p.add_argument('--timeline',
                 help='write the timeline PNG of the fastest K=2 greedy '
                 'decode here')
  p.add_argument('--timeline_steps', type=int, default=4,
                 help='decoding steps the timeline shows')
  p.add_argument('--xla', action='store_true',
                 help="also decode each pipelined configuration with "
                 "compile='xla' (the stage functions compiled by XLA): "
                 'speed, first decode and graph size side by side')
  p.add_argument('--memory_cap',
                 help="e.g. '1.5GiB': instead, decode a model too big for "
                 'one worker under this memory cap per worker process (a '
                 'cgroup each; Linux cgroup v1, root) with K = '
                 '--memory_stages')
  p.add_argument('--memory_stages', default='1,2',
                 help='with --memory_cap: the K values tried')
  p.add_argument('--memory_batch', type=int, default=16,
                 help='with --memory_cap: sentences decoded together, greedy')
  p = sub.add_parser('plan', help=plan.Plan.__doc__)
  Common(p)
  p.add_argument('--models', default='',
                 help='comma-separated subset of transformer,amoeba,dense')
  p.add_argument('--top', type=int, default=5,
                 help="the planner's candidates to run")
  p.add_argument('--cap_fraction', type=float, default=0.5,
                 help="the memory cap: this fraction of fill-drain's "
                 'predicted need at K=2, M=8 without remat')
  p.add_argument('--max_micro_batches', type=int,
                 default=plan.MAX_MICRO_BATCHES)
  p.add_argument('--repeats', type=int, default=5,
                 help='timed runs per profiled figure (the median)')
  p.add_argument('--core', type=int, default=0,
                 help='the core the profile is measured on')
  p.add_argument('--profile_dir', help='save each model\'s profile here')
  p.add_argument('--calibrate', default=True,
                 action=argparse.BooleanOptionalAction,
                 help='calibrate the profile against the executor\'s stage '
                 'calls and two workers computing at once '
                 '(gpipe/plan/calibrate.py)')
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)
  p = sub.add_parser('plan_trainer', help=plan_trainer.PlanTrainer.__doc__)
  Common(p)
  p.add_argument('--models', default='',
                 help='comma-separated registered models (default: %s)' %
                 ','.join(plan_trainer.MODELS))
  p.add_argument('--devices', type=int, default=2,
                 help='local worker processes to plan for and train on')
  p.add_argument('--top', type=int, default=4,
                 help='configurations to train: the pick, then the best of '
                 'each other shape and schedule family')
  p.add_argument('--repeats', type=int, default=3,
                 help="the planner's timed runs per profiled figure")
  p.add_argument('--steps', type=int, default=20,
                 help='timed trainer steps per configuration (the median)')
  p.add_argument('--warmup', type=int, default=4,
                 help='untimed trainer steps first (a multiple of the '
                 'trainer runs\' logging period, 4)')
  p.add_argument('--passes', type=int, default=2,
                 help='runs of each configuration, one pass over all of '
                 'them after another; the fastest pass\'s median is the '
                 'measured step (a shared machine\'s bursts of load)')
  p = sub.add_parser('xla_trainer', help=xla_trainer.XlaTrainer.__doc__)
  Common(p)
  TrainerRuns(p, xla_trainer.MODELS)
  p.add_argument('--schedules', default='',
                 help='comma-separated schedules (default: all of the '
                 'registry)')
  p.add_argument('--steps', type=int, default=6,
                 help='training steps of each run')
  p.add_argument('--warmup', type=int, default=2,
                 help='leading steps left out of the step time')
  p = sub.add_parser('elastic', help=elastic.Elastic.__doc__)
  Common(p)
  TrainerRuns(p, elastic.MODELS)
  p.add_argument('--scenarios', default=_ELASTIC_SCENARIOS,
                 help='comma-separated subset of loss_and_return, restart, '
                 'throttled')
  p.add_argument('--steps', type=int, default=120,
                 help='training steps of each run')
  p.add_argument('--loss_step', type=int, default=35,
                 help='the step after which a worker is killed')
  p.add_argument('--return_after', type=int, default=25,
                 help='steps on the shrunk shape before the worker returns')
  p.add_argument('--checkpoint_every', type=int, default=10,
                 help='the trainer\'s checkpoint (and log) period')
  p.add_argument('--worker_wait_secs', type=float, default=5.0,
                 help='how long the trainer waits for a lost worker')
  p.add_argument('--throttle_cores', type=float, default=0.5,
                 help='the CPU quota of the slow worker, in cores')
  p.add_argument('--workers', type=int, default=4,
                 help='worker processes of the lost-and-returned and the '
                 'restarted runs (the last one is lost)')
  p.add_argument('--shape_flags', default=None,
                 help='the starting shape\'s trainer flags, space-separated '
                 '(default: --data_parallel=2 --num_micro_batches=2; e.g. '
                 '\'--num_micro_batches=4\' for mt.T64Structure_Tiny\'s 16 '
                 'stages on --workers=16)')
  p.add_argument('--model_params_override', default='',
                 help='the trainer\'s --model_params_override for every run '
                 '(e.g. \'task.dtype=float64; input.feature_dtype=float64\' '
                 'for the image models, to compare losses to float64 '
                 'rounding)')
  p.add_argument('--compare_losses', default=True,
                 action=argparse.BooleanOptionalAction,
                 help='also train uninterrupted in the starting shape and '
                 'compare every step\'s loss with the lost-and-returned '
                 'run\'s')
  p = sub.add_parser('startup', help=startup.Startup.__doc__)
  Common(p)
  p.add_argument('--before',
                 help='another checkout of this project whose trainer runs '
                 'first, side by side (e.g. git worktree add /tmp/before '
                 '<commit>)')
  p.add_argument('--before_env', default='',
                 help="NAME=VALUE,... for the --before run, e.g. "
                 "'PYTHONPATH=DIR' to put another package set first")
  p.add_argument('--model', default='mt.T64Structure_Numbers',
                 help='the registered model the trainer starts')
  p.add_argument('--worker_processes', type=int, default=16,
                 help='local worker processes (0: in-process devices)')
  p.add_argument('--step_timeout_secs', type=int, default=2400,
                 help="the trainer's --step_timeout_secs (a first step "
                 'optimizes, partitions and instantiates the whole graph)')
  p.add_argument('--timeout_secs', type=int, default=5400,
                 help='stop a trainer that runs longer than this')
  return parser


def _ApplyQuick(args):
  """Shrinks the parsed defaults of ``--quick`` runs to tiny sizes."""
  for name, value in (('steps', 1), ('warmup', 1)):
    if hasattr(args, name):
      setattr(args, name, value)
  if args.command == 'throughput' and args.micro_batches == '1,4,8,32':
    args.micro_batches = '1,2'
    if args.loop_micro_batches == '8':
      args.loop_micro_batches = '2'
    if args.stages_per_device == '1,2,4':
      args.stages_per_device = '1,2'
  if args.command == 'bubble' and args.micro_batches == '1,2,4,8,16,32':
    args.micro_batches = '1,2'
    args.timeline_m = 2
  if args.command == 'schedules':
    if args.micro_batches == '1,2,4,8,16,32':
      args.micro_batches = '2,4'
    args.memory_m = 4 if args.memory_m == 16 else args.memory_m
    args.trace_steps = 1
    args.timeline_m = 2
  if args.command == 'cost' and args.micro_batches == '32':
    args.micro_batches = '2'
  if args.command == 'data_parallel':
    args.trace_steps = 1
  if args.command == 'links':
    args.num_stages = '2' if args.num_stages == '2,4' else args.num_stages
    if args.micro_batches == '4,8,16':
      args.micro_batches = '2'
    if args.schedules == 'gpipe,1f1b,zb_h1':
      args.schedules = 'gpipe,1f1b'
    args.delays_ms = '0,1' if args.delays_ms == '0,1,5' else args.delays_ms
  if args.command == 'decode':
    args.lanes, args.beams = '2', '1,2'
    args.batch, args.beam_batch = 4, 2
    args.trace_steps = 1
  if args.command == 'plan':
    args.top = min(args.top, 2)
    args.repeats = 1
    args.max_micro_batches = min(args.max_micro_batches, 2)
  if args.command == 'plan_trainer':
    args.top, args.repeats, args.steps = min(args.top, 2), 1, 2
    if not args.models:
      args.models = 'toy.PipelinedDigitsMlp'
  if args.command == 'xla_trainer':
    args.steps, args.warmup = 2, 1
    args.models = args.models or 'toy.PipelinedDigitsMlp'
    args.schedules = args.schedules or 'gpipe,zb_v'
  if args.command == 'elastic':
    args.models = args.models or 'toy.PipelinedDigitsMlp'
    # Toy steps take milliseconds: enough of them that the run is still
    # going when the returned worker serves (seconds).
    args.steps, args.loss_step, args.return_after = 1500, 30, 10
    args.checkpoint_every, args.worker_wait_secs = 25, 1.0
    if args.scenarios == _ELASTIC_SCENARIOS:
      # The toy model's stages are too light for a quota to show.
      args.scenarios = 'loss_and_return,restart'
  if args.command == 'startup' and args.model == 'mt.T64Structure_Numbers':
    args.model, args.worker_processes = 'mt.NumbersTiny', 2
  if args.command == 'memory':
    args.cap_mib = min(args.cap_mib, 4.0)
    args.micro_batches = 2
    args.max_layers = min(args.max_layers, 12)


def main(argv=None):
  """Runs one subcommand.

  Args:
    argv: the arguments after the program name (default: ``sys.argv[1:]``).

  Returns:
    The exit status, 0.
  """
  # `bazel run` starts in the runfiles tree: resolve paths where it was run.
  if os.environ.get('BUILD_WORKING_DIRECTORY'):
    os.chdir(os.environ['BUILD_WORKING_DIRECTORY'])
  args = _Parser().parse_args(argv)
  if args.quick:
    _ApplyQuick(args)
  commands = dict(throughput=throughput.Throughput, memory=memory.Memory,
                  bubble=bubble.Bubble, graph=graph.Graph,
                  schedules=schedules.Schedules, cost=cost.Cost,
                  data_parallel=data_parallel.DataParallel, links=links.Links,
                  decode=lambda a: (decode_memory.MemoryCap if a.memory_cap
                                    else decode.Decode)(a), plan=plan.Plan,
                  plan_trainer=plan_trainer.PlanTrainer,
                  startup=startup.Startup,
                  xla_trainer=xla_trainer.XlaTrainer,
                  elastic=elastic.Elastic)
  commands[args.command](args)
  return 0
