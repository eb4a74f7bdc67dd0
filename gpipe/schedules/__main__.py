"""Prints the schedule registry as a table and draws each schedule.

  python -m gpipe.schedules [K [M]]
"""

import sys

from gpipe.schedules import decode_lanes
from gpipe.schedules import inference
from gpipe.schedules import registry
from gpipe.schedules import render


def main(argv):
  k = int(argv[1]) if len(argv) > 1 else 4
  m = int(argv[2]) if len(argv) > 2 else 8
  print(registry.MarkdownTable())
  for name in registry.Names():
    schedule = registry.Get(name)
    v = schedule.stages_per_device
    devices = max(1, k // v)
    where = registry.Placement(name, devices * v, devices)
    print('%s, %d stages on %d devices, M=%d:' % (name, devices * v, devices,
                                                  m))
    try:
      print(render.RenderSchedule(name, where, m))
    except ValueError as e:
      print('  (%s)' % e)
    print()
  print(inference.MarkdownTable())
  print('forward_only, %d stages, M=%d:' % (k, m))
  print(inference.Render(k, m))
  print()
  print('decode_lanes, %d stages, M=%d lanes, 3 steps:' % (k, m))
  print(decode_lanes.Render(k, m, 3))


if __name__ == '__main__':
  main(sys.argv)
