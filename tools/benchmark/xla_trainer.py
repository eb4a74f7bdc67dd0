"""The xla_trainer subcommand: ``--xla`` through the trainer, beside no XLA.

``//tests:xla_stages_test`` proves on toy layers in float64 that a compiled
pipeline computes the uncompiled one's loss and gradients, dropout included.
This subcommand checks what a user runs: for each registered model and each
schedule of the registry, the trainer (``python -m tools.trainer``, its
default in-process devices) trains ``--steps`` steps with and without
``--xla`` from the same initial weights and input, and reports

* the first step's loss and gradient norm (``grad_norm/all/loss``) against
  the uncompiled run's: the same weights and examples, so any difference is
  arithmetic, not dropout (its masks are the same compiled or not);
* the largest loss difference over the later steps, beside the spread of the
  uncompiled schedules among themselves at the same steps (they compute the
  same mathematics in other float32 orders, so their spread is what float32
  rounding does to this model's training: an XLA difference of that size is
  rounding, one far above it is a bug);
* the median step after ``--warmup`` compiled over uncompiled, and the
  seconds to the end of the first step of each (XLA compiles there);
* for models that decode, the decode outputs of the uncompiled run's final
  checkpoint with and without ``--xla`` (the trainer's ``--mode=decode``;
  pipelined decoding where the model has it): equal or not.
"""

import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

from gpipe.schedules import registry
from tools.benchmark import report
from tools.trainer import progress
from tools.trainer import timed_run

# The default model, and the smallest registered Transformer with dropout.
MODELS = ('image.AmoebaNetD_Digits', 'mt.NumbersSmall')
# Models whose decode mode gives outputs to compare.
DECODES = ('mt.',)
_GRAD_NORM = 'grad_norm/all/loss'


def _Trainer(args, timeout):
  """Runs the trainer with `args`; its console text (raises on failure)."""
  command = [sys.executable, '-m', 'tools.trainer'] + args
  done = subprocess.run(command, cwd=timed_run.ROOT,
                        env=timed_run.Environment(), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True,
                        stdin=subprocess.DEVNULL, timeout=timeout,
                        check=False)
  if done.returncode:
    raise RuntimeError('the trainer failed (exit %d): %s\n%s' % (
        done.returncode, ' '.join(args), done.stdout[-3000:]))
  return done.stdout


def _Steps(logdir):
  """The step log's records, in step order."""
  return progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))


def _DecodeOut(logdir):
  """The text of the newest decode output file, or None."""
  paths = sorted(glob.glob(os.path.join(logdir, 'decode_*',
                                        'decode_out_*.txt')))
  if not paths:
    return None
  with open(paths[-1]) as f:
    return f.read()


def _Run(model, schedule, xla, steps, warmup, workdir, timeout):
  """One training run (and a decode for decoding models); its figures."""
  logdir = os.path.join(workdir, '%s_%s_%s' % (
      model, schedule, 'xla' if xla else 'plain'))
  flags = ['--model=' + model, '--logdir=' + logdir, '--schedule=' + schedule,
           '--max_steps=%d' % steps, '--log_every_n_steps=1',
           '--checkpoint_every_n_steps=%d' % (10 * steps),
           '--trace_every_n_steps=0', '--eval_after_train=false']
  if xla:
    flags.append('--xla')
  output = _Trainer(flags, timeout)
  records = _Steps(logdir)
  batch = records[0].get('num_samples_in_batch', 1.0)
  seconds = progress.StepSeconds(output, batch, warmup)
  with open(os.path.join(logdir, 'startup.json')) as f:
    startup = json.load(f)
  return dict(logdir=logdir, losses=[r['loss'] for r in records],
              grad_norm=records[0].get(_GRAD_NORM),
              step_ms=1e3 * statistics.median(seconds) if seconds else None,
              first_steps_s=startup.get('since_trainer_start',
                                        startup.get('total_seconds')))


def _Decodes(model, logdir, timeout):
  """The decode outputs of `logdir`'s checkpoint without and with --xla."""
  outputs = []
  for xla in (False, True):
    _Trainer(['--model=' + model, '--logdir=' + logdir, '--mode=decode',
              '--decode_max_batches=2'] + (['--xla'] if xla else []), timeout)
    outputs.append(_DecodeOut(logdir))
  return outputs


def _Relative(a, b):
  return abs(a - b) / max(abs(b), 1e-30)


def XlaTrainer(args):
  """``--xla`` against no XLA through the trainer (see the module doc)."""
  models = [m for m in args.models.split(',') if m] or list(MODELS)
  schedules = ([s for s in args.schedules.split(',') if s] or
               list(registry.Names()))
  title, info = report.Header(
      '--xla through the trainer', dict(models=','.join(models),
                                        schedules=','.join(schedules),
                                        steps=args.steps, warmup=args.warmup))
  workdir = tempfile.mkdtemp(prefix='gpipe_xla_trainer_')
  rows, results = [], []
  for model in models:
    runs = {}
    for schedule in schedules:
      for xla in (False, True):
        report.Log('training %s, %s, %s' % (model, schedule,
                                            'xla' if xla else 'uncompiled'))
        runs[schedule, xla] = _Run(model, schedule, xla, args.steps,
                                   args.warmup, workdir, args.timeout_secs)
    plain = [runs[s, False]['losses'] for s in schedules]
    # Per later step: the uncompiled schedules' spread, relative.
    spread = max(
        (max(l[i] for l in plain) - min(l[i] for l in plain)) /
        abs(statistics.mean(l[i] for l in plain))
        for i in range(1, args.steps)) if args.steps > 1 else 0.0
    for schedule in schedules:
      a, b = runs[schedule, True], runs[schedule, False]
      later = max((_Relative(x, y) for x, y in zip(a['losses'][1:],
                                                    b['losses'][1:])),
                  default=0.0)
      ratio = (b['step_ms'] / a['step_ms']
               if a['step_ms'] and b['step_ms'] else None)
      same_tokens = None
      if model.startswith(DECODES):
        # One checkpoint (the uncompiled run's) decoded both ways.
        plain_out, xla_out = _Decodes(model, b['logdir'], args.timeout_secs)
        same_tokens = plain_out is not None and plain_out == xla_out
      result = dict(model=model, schedule=schedule,
                    first_loss=(a['losses'][0], b['losses'][0]),
                    first_loss_error=_Relative(a['losses'][0],
                                               b['losses'][0]),
                    first_grad_norm_error=_Relative(a['grad_norm'],
                                                    b['grad_norm']),
                    later_loss_error=later, schedules_spread=spread,
                    step_ms=(a['step_ms'], b['step_ms']),
                    speed_up=ratio,
                    first_steps_s=(a['first_steps_s'], b['first_steps_s']),
                    same_decode=same_tokens)
      results.append(result)
      rows.append([model, schedule, '%.1e' % result['first_loss_error'],
                   '%.1e' % result['first_grad_norm_error'],
                   '%.1e' % later, '%.1e' % spread,
                   '%.2fx' % ratio if ratio else '-',
                   '%.0f / %.0f' % (a['first_steps_s'], b['first_steps_s']),
                   {None: '-', True: 'equal', False: 'DIFFER'}[same_tokens]])
  markdown = '\n'.join([title, report.Table(
      ['model', 'schedule', 'step 1 loss, rel. diff', 'step 1 grad norm, '
       'rel. diff', 'later losses, largest rel. diff', 'uncompiled '
       'schedules\' spread', 'step speed-up', 's to step 2, xla / not',
       'decode outputs'], rows), ''])
  print(markdown, flush=True)
  report.Write(args, dict(markdown=markdown, machine=info, results=results),
               None)
  return results
