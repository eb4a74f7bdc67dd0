"""decode --memory_cap: a Transformer too big for one worker, decoded on K.

Every worker process runs under a memory cap (``LocalCluster``'s
``memory_cap_bytes``: a cgroup of its own, ``gpipe.runtime.memory_cap``),
the stand-in for a device's memory. A Transformer whose weights exceed the
cap is decoded greedily with K = 1, 2, ... stages, one pinned one-core worker
each, cut by weight bytes (``partition_cost='params'``) and pipelined in the
default lanes. Each worker restores only its own stages' weights. A K too
small fails with the worker's ``WorkerMemoryCapError`` (which worker, its
cap, and to use more stages); a K that fits decodes and its tokens are
compared with the unpipelined decoder's, run in this process without a cap
(which also saves the random weights every K restores).

Reported per K: whether it fit, each stage's weight bytes, each worker's
peak memory as its cgroup counts it (and its VmHWM), and sentences per
second; or the error.
"""

import os
import statistics
import tempfile

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import partition
from gpipe.measure import memory
from gpipe.plan import search
from gpipe.runtime import local_cluster
from gpipe.schedules import decode_lanes
from tools.benchmark import decode
from tools.benchmark import report

# A Transformer-big-shaped T(8, 4096, 16): d_model 1024, vocabulary 32000;
# about 301M float32 parameters (1.2 GB).
MEMORY_MODEL = dict(vocab_size=32000, model_dim=1024, hidden_dim=4096,
                    num_heads=16, num_layers=8, src_len=16, max_decode_len=16)
QUICK_MEMORY_MODEL = dict(vocab_size=4000, model_dim=256, hidden_dim=1024,
                          num_heads=4, num_layers=2, src_len=6,
                          max_decode_len=4)


def StageWeightBytes(shape, stage_sizes):
  """Each stage's weight bytes for the model `shape` cut into `stage_sizes`."""
  costs = partition.ParamsCosts(decode.Layers(shape))
  result, start = [], 0
  for size in stage_sizes:
    result.append(int(sum(costs[start:start + size])))
    start += size
  return result


def ReferenceDecode(shape, batch, checkpoint):
  """The unpipelined decoder's tokens in this process; saves the weights.

  Args:
    shape: the model sizes.
    batch: sentences decoded together.
    checkpoint: where the random weights are saved.

  Returns:
    (ids, weight bytes).
  """
  step = decode.DecodeStep(decode.DecodeConfig(1, None, 1, batch), shape, '',
                           ['/device:CPU:0'], checkpoint, cut='params')
  try:
    _, ids, _ = step.Run(trace=True)
  finally:
    step.Close()
  return ids, step.weight_bytes


def CappedDecode(shape, num_stages, cap_bytes, batch, checkpoint, steps=1,
                 log=report.Log):
  """Decodes on `num_stages` capped workers; returns the measurements.

  Args:
    shape: the model sizes.
    num_stages: K (one pinned one-core worker each).
    cap_bytes: each worker's memory cap.
    batch: sentences decoded together (greedy).
    checkpoint: the weights (``ReferenceDecode`` saved them).
    steps: timed decodes after the first.
    log: a print-like function for progress lines.

  Returns:
    A dict: K, M, stage_sizes, stage_weight_bytes, ids, seconds,
    sentences_per_second, peak_bytes (per worker, as its cap counts it) and
    peak_rss_bytes (VmHWM).

  Raises:
    local_cluster.WorkerMemoryCapError: a worker was killed by the cap.
  """
  lanes = decode_lanes.DefaultNumLanes(num_stages, batch)
  cluster = local_cluster.LocalCluster(
      num_stages, pin_cores=True, intra_op_threads=1,
      memory_cap_bytes=cap_bytes)
  step = None
  try:
    step = decode.DecodeStep(
        decode.DecodeConfig(num_stages, lanes, 1, batch), shape,
        cluster.target, cluster.devices, checkpoint, cut='params',
        cluster=cluster)
    log('K=%d restored its weights' % num_stages)
    _, ids, _ = step.Run(trace=True)
    times = [step.Run() for _ in range(steps)]
    seconds = statistics.median(times) if times else None
    return dict(
        K=num_stages, M=lanes, stage_sizes=step.stage_sizes,
        stage_weight_bytes=StageWeightBytes(shape, step.stage_sizes),
        ids=ids, seconds=seconds,
        sentences_per_second=batch / seconds if seconds else None,
        peak_bytes=cluster.MemoryPeakBytes(),
        peak_rss_bytes=cluster.PeakRssBytes())
  finally:
    if step is not None:
      step.Close()
    cluster.Stop()


def MemoryCap(args):
  """A model over one worker's memory cap, decoded on K capped workers."""
  shape = QUICK_MEMORY_MODEL if args.quick else MEMORY_MODEL
  cap = search.ParseBytes(args.memory_cap)
  stages = [int(k) for k in args.memory_stages.split(',')]
  batch = args.memory_batch
  settings = dict(shape, memory_cap=args.memory_cap, cap_bytes=cap,
                  stages=stages, batch=batch, steps=args.steps)
  header, info = report.Header(
      'Pipelined decoding of a model too big for one worker', settings)
  checkpoint = os.path.join(tempfile.mkdtemp(), 'decode_model')
  reference, weight_bytes = ReferenceDecode(shape, batch, checkpoint)
  report.Log('weights %s, cap %s per worker' % (
      memory.FormatMiB(weight_bytes), memory.FormatMiB(cap)))
  result = dict(machine=info, settings=settings, weight_bytes=weight_bytes,
                runs=[])
  rows = []
  for k in stages:
    try:
      run = CappedDecode(shape, k, cap, batch, checkpoint, args.steps)
    except local_cluster.WorkerMemoryCapError as e:
      report.Log('K=%d: %s' % (k, e))
      result['runs'].append(dict(K=k, fits=False, error=str(e)))
      rows.append([k, '-', '-', 'no: killed by the cap', '-', '-', '-'])
      continue
    run['same_tokens'] = bool(np.array_equal(run.pop('ids'), reference))
    run['fits'] = True
    result['runs'].append(run)
    rows.append([
        k, run['M'],
        ', '.join(memory.FormatMiB(b) for b in run['stage_weight_bytes']),
        'yes', ', '.join(memory.FormatMiB(b) for b in run['peak_bytes']),
        run['sentences_per_second'], 'yes' if run['same_tokens'] else 'NO'])
  text = header + '\n' + ('Weights: %s in total; cap: %s per worker.\n\n' % (
      memory.FormatMiB(weight_bytes), memory.FormatMiB(cap))) + report.Table(
          ['K', 'M', 'weights per stage', 'fits', 'peak per worker (cgroup)',
           'sentences/s', 'tokens = unpipelined'], rows)
  failures = [r['error'] for r in result['runs'] if not r['fits']]
  if failures:
    text += '\n\nThe error:\n\n    ' + failures[0]
  print(text)
  result['markdown'] = text
  report.Write(args, result, None)
  return result
