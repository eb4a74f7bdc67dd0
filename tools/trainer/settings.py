"""The trainer's settings, written once: each one is a field of ``Settings``.

A field holds a setting's name, type, default and help text (its metadata);
from the fields:

* ``DefineFlags`` defines the trainer's absl flags, one per field (the type
  from the annotation: str, int, float, bool, Optional of one; an enum where
  the field lists its choices);
* ``FromFlags`` reads a command line's ``Settings``;
* ``run_config.RunConfig`` extends ``Settings`` with what the run settled
  (the params with their stage devices, the placement), so everything after
  reads ``run.<setting>``.

A new setting is one field here: its flag, its value on the command line
and its ``run.<name>`` follow. Checks across settings and the flags' effects
live where the run is settled (``run_config.Settle``).
"""

import dataclasses
import typing
from typing import Optional

from absl import flags
from gpipe.runtime import devices
from gpipe.schedules import registry as schedule_registry

MODES = ('train', 'eval', 'decode', 'train_and_eval', 'inspect_model')
DEFAULT_MODEL = 'image.AmoebaNetD_Digits'

# Flags of this type by the (non-optional) type of a field.
_DEFINE = {
    str: flags.DEFINE_string,
    int: flags.DEFINE_integer,
    float: flags.DEFINE_float,
    bool: flags.DEFINE_bool,
}


def Setting(default, help_text, choices=None, defined_by=None):
  """A field of Settings: a setting with its flag's default and help.

  Args:
    default: the default value (also the flag's).
    help_text: the flag's help.
    choices: the allowed values (the flag is an enum), or None.
    defined_by: the module that defines the flag, when not this one (the
      field is read from it, not defined again), or None.

  Returns:
    A dataclasses.field.
  """
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, choices=choices, defined_by=defined_by))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """What one trainer invocation is asked to do: every flag of the trainer.

  Each field's help is its flag's (``python -m tools.trainer --help``).
  """
  model: str = Setting(
      DEFAULT_MODEL,
      'The registered model: family.ClassName (params/family.py).')
  logdir: Optional[str] = Setting(
      None, 'The run directory: checkpoints, event files, logs.')
  mode: str = Setting('train', 'What to do.', choices=MODES)
  model_params_override: str = Setting(
      '', "Overrides of the model's params ('task.network.remat=never').",
      defined_by='lingvo.model_registry')
  max_steps: Optional[int] = Setting(
      None, 'Train to this global step (default: p.train.max_steps).')
  num_stages: Optional[int] = Setting(
      None, 'Override K, the pipeline stages of the model.')
  num_micro_batches: Optional[int] = Setting(
      None, 'Override M, the micro-batches per mini-batch.')
  schedule: Optional[str] = Setting(
      None, 'Override the pipeline schedule: ' + schedule_registry.ParamDoc() +
      '. See gpipe/schedules/ and the README table.',
      choices=schedule_registry.Names())
  xla: bool = Setting(
      False, "Compile every pipeline stage function with XLA (the pipelines' "
      "compile='xla', gpipe/xla.py): fused stages, compiled at the first "
      'step; an op XLA cannot compile is an error naming it. See '
      'docs/TRAINER.md.')

  # Where the stages run (tools/trainer/placement.py, gpipe/runtime/).
  worker_processes: int = Setting(
      0, 'Start this many local TensorFlow worker processes, one stage on '
      'each.')
  loop_stages: bool = Setting(
      False, 'With fewer workers/devices than stages: place stage k on '
      'worker k mod D, several stages per worker, run breadth-first (smaller '
      'bubble).')
  pin_cores: bool = Setting(
      False, 'With --worker_processes: pin worker i to core i.')
  cluster_spec: str = Setting(
      '', "Running workers (python -m gpipe.worker): 'worker=host:port,"
      "host:port', a JSON cluster dict or TF_CONFIG JSON (default: "
      '$TF_CONFIG, if set). Stages are laid out on their devices task by '
      'task.')
  device_type: str = Setting(
      'auto', 'The devices stages run on: auto is the GPUs every worker task '
      'has, else CPU. tpu stops at once, saying what TPUs the run has: '
      'stages on TPU cores are not built (docs/TPU.md).',
      choices=devices.DEVICE_TYPES)
  devices_per_task: int = Setting(
      0, 'Use the first N devices of --device_type on each worker task (0: '
      'all). With --worker_processes: virtual CPUs per local worker. With '
      '--mode=inspect_model and a cluster: plan N devices per task without '
      'connecting; with --mode=inspect_model --device_type=gpu and no '
      'cluster: plan N GPUs in this process (default: as many as the stages '
      'need; no GPU needed).')
  connect_timeout_secs: float = Setting(
      10.0, 'The longest each check of a running worker (reachable, serving '
      'as its task, its devices) may take before the run stops with its '
      'address.')
  fprop_dtype: str = Setting(
      'float32', "Compute dtype of the model's layers: 'float32', or "
      "'bfloat16' for mixed precision (variables, optimizer slots, gradient "
      'accumulation and the loss stay float32; see gpipe/precision.py). '
      'float16 is refused (it needs loss scaling).')
  data_parallel: int = Setting(
      1, 'R: train R data-parallel replicas of the pipeline on R x K workers '
      '(--worker_processes=R*K or --cluster_spec with R*K servers; default: '
      'R x K virtual CPUs). Replica r takes 1/R of each mini-batch on '
      'workers r*K .. r*K+K-1; the gradients are summed in the graph, one '
      'update, one copy of the variables (checkpoints do not depend on R).')
  max_worker_restarts: int = Setting(
      0, 'When a worker dies, restore the newest checkpoint and go on, at '
      'most this many times (0: stop with an error). With '
      '--worker_processes the trainer stops the workers and starts fresh '
      'ones; with a running cluster (--cluster_spec or TF_CONFIG) it names '
      'the lost task and waits up to --worker_wait_secs for its supervisor '
      'to start it again at the same address. With --elastic: how many '
      'times a lost local worker is restarted alone (the others keep '
      'running) before the run shrinks instead of stopping (0: shrink at '
      'once); a running cluster is waited for without it.')
  worker_wait_secs: float = Setting(
      300.0, 'With a running cluster and --max_worker_restarts: how long to '
      'wait for lost servers to serve again before stopping with the '
      'reason. With --elastic (a running cluster, with or without '
      '--max_worker_restarts): how long to wait for lost servers, or for '
      'replacements at new addresses in --cluster_spec=@FILE, before the '
      "run shrinks to the tasks that serve; a new session's check of the "
      'tasks then waits no longer than this (at most 10 s) for one that '
      'does not answer.')
  elastic: bool = Setting(
      False, 'With --worker_processes, --cluster_spec or TF_CONFIG: when a '
      'task is lost and not back in time (--max_worker_restarts, '
      '--worker_wait_secs), go on with the tasks that serve in a new shape '
      "(R, K, M, schedule: the planner from the run's saved profile under "
      '--memory_per_device, else the fallback rule; the global batch and R x '
      'M kept where the counts allow) from the newest checkpoint; grow again '
      'at a checkpoint when tasks come back (--cluster_spec=@FILE is read '
      'again). See docs/ELASTIC.md.')

  # The training loop.
  checkpoint_every_n_steps: int = Setting(100, 'Checkpoint period.')
  log_every_n_steps: int = Setting(
      10, 'Console progress line and summary period.')
  trace_every_n_steps: int = Setting(
      100, 'Trace a step this often for the timeline, bubbles and peak '
      'memory (also the 2nd step of each run); 0: never.')
  seed: int = Setting(
      1234, 'Random seed (graph; and the input order when given).')
  session_graph_optimizer: bool = Setting(
      False, "Run Grappler's meta-optimizer over the session's graph. Off by "
      'default: the stage functions are still optimized on their workers, '
      "and on a large pipeline the whole-graph passes cost much of the first "
      "step and of the session master's memory.")
  square_norms: bool = Setting(
      True, "Build Lingvo's learner's squared norms (its grad_norm and "
      'var_norm metrics, global-norm clipping, L2 regularization, norm '
      'summaries) with Square ops, not Pow: the same sums to within '
      'rounding, a faster step on CPUs (gpipe/compat/lingvo_norms.py). '
      "false: Lingvo's own Pow ops. With --session_graph_optimizer, "
      'Grappler makes that rewrite itself. The planner times the trainer '
      'with the default.')
  step_timeout_secs: int = Setting(
      300, 'A session run longer than this fails (lost workers).')
  eval_after_train: bool = Setting(
      True, 'In train mode, evaluate on Test() at the end.')
  decode_max_batches: Optional[int] = Setting(
      None, 'Decode at most this many batches (default: all).')

  # Pipelined decoding (tasks/mt/pipelined_decode.py, gpipe/lanes.py).
  decode_micro_batches: Optional[int] = Setting(
      None, 'M: decode each batch in M lanes through the pipeline stages '
      '(must divide the batch; default K lanes for the K stages of the '
      'decoding loop, 1 for K = 1).')
  pipelined_decode: Optional[bool] = Setting(
      None, 'Decode through the pipeline stages on their devices, in lanes '
      '(default for models that can); --nopipelined_decode runs the '
      'unpipelined decoder, for comparison.')

  # The planner (tools/trainer/planned.py, gpipe/plan/).
  plan: str = Setting(
      '', "'auto': measure the model, simulate every configuration for the "
      "run's devices (those the stages are laid out on: every device of the "
      'local workers or cluster tasks, --devices_per_task of each if given; '
      "else this process's GPUs, else the cores) under --memory_per_device, "
      'print the table and train the fastest that fits; or a plan file from '
      'python -m tools.plan --plan_out for that many devices. Sets K, the '
      'cut, M, schedule, remat, batched weight gradients, --data_parallel '
      'and --fprop_dtype; written to <logdir>/plan.json.')
  memory_per_device: str = Setting(
      '', "With --plan=auto: each device's memory, e.g. '16GiB'; with "
      '--elastic also the cap of the shapes it moves to.')

  def Values(self):
    """{name: value} of every setting (a shallow copy)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(
        Settings)}


def _FlagType(field):
  """The type of a field's flag: its annotation without Optional."""
  kinds = [t for t in typing.get_args(field.type) if t is not type(None)]
  return kinds[0] if kinds else field.type


def DefineFlags(flag_values=flags.FLAGS):
  """Defines a flag for every setting not defined elsewhere."""
  for field in dataclasses.fields(Settings):
    meta = field.metadata
    if meta['defined_by']:
      continue
    if meta['choices']:
      flags.DEFINE_enum(field.name, field.default, list(meta['choices']),
                        meta['help'], flag_values=flag_values)
    else:
      _DEFINE[_FlagType(field)](field.name, field.default, meta['help'],
                                flag_values=flag_values)


def FromFlags(flag_values=flags.FLAGS):
  """The Settings of the parsed flags."""
  return Settings(**{f.name: flag_values[f.name].value
                     for f in dataclasses.fields(Settings)})


def Given(flag_values, names):
  """{name: whether the command line sets it} (given, or not the default)."""
  return {name: flag_values[name].present or
                flag_values[name].value != flag_values[name].default
          for name in names}
