"""Trains the sentencepiece vocabulary of a translation task from its text.

Usage (from the repository root)::

  # The offline number corpus (training numbers only, never the test ones):
  .venv/bin/python -m tools.build_vocab --corpus=numbers \\
      --output_prefix=/tmp/gpipe_data/mt/numbers_spm --vocab_size=512

  # A prepared tfds translation corpus (its training split), e.g. the one
  # the mt.T* configurations read, at the path and size they expect:
  .venv/bin/python -m tools.build_vocab --corpus=tfds \\
      --tfds_name=ted_multi_translate --data_dir=/data/tfds \\
      --languages=en,de,fr,es,it,pt,ru,ja,ko,zh-cn \\
      --output_prefix=/tmp/gpipe_data/mt/ted_spm64k --vocab_size=64000

  # Any text files, one sentence per line:
  .venv/bin/python -m tools.build_vocab --corpus=text --input=a.txt,b.txt \\
      --languages=de,en,fr --output_prefix=/data/ted_spm --vocab_size=32000
"""

import argparse
import sys

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from tasks.mt import corpus
from tasks.mt import inputs
from tasks.mt import vocab


def _Args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--corpus', choices=['numbers', 'tfds', 'text'],
                      default='numbers', help='Where the training text is.')
  parser.add_argument('--input', default='',
                      help='Comma-separated text files (--corpus=text).')
  parser.add_argument('--tfds_name', default='ted_multi_translate',
                      help='--corpus=tfds: the prepared tfds translation '
                      'corpus (with its config, e.g. wmt14_translate/de-en).')
  parser.add_argument('--data_dir', default=None,
                      help="--corpus=tfds: where it is prepared (default: "
                      "tfds's, ~/tensorflow_datasets).")
  parser.add_argument('--split', default='train',
                      help='--corpus=tfds: the split whose text to read.')
  parser.add_argument('--max_sentences', type=int, default=2000000,
                      help='--corpus=tfds: read at most this many sentences '
                      '(0: all).')
  parser.add_argument('--output_prefix', default=vocab.NUMBERS_VOCAB[:-6],
                      help='Writes <prefix>.model and <prefix>.vocab.')
  parser.add_argument(
      '--vocab_size', type=int, default=512,
      help="Pieces, with the special and tag tokens; at most the model's "
      'vocab_size (mt.NumbersSmall: 512).')
  parser.add_argument('--languages', default=','.join(
      corpus.DEFAULT_LANGUAGES), help='Languages whose <2xx> tags to add.')
  parser.add_argument('--max_number', type=int, default=1000,
                      help='Number corpus: numbers in [0, max_number).')
  parser.add_argument('--test_fraction', type=float, default=0.1,
                      help='Number corpus: held-out fraction (excluded).')
  parser.add_argument('--split_seed', type=int, default=0,
                      help='Number corpus: seed of the train/test split.')
  parser.add_argument('--model_type', default='unigram',
                      choices=['unigram', 'bpe', 'char', 'word'])
  return parser.parse_args(argv)


def _Sentences(args, languages):
  if args.corpus == 'numbers':
    train, _ = corpus.SplitNumbers(args.max_number, args.test_fraction,
                                   args.split_seed)
    return corpus.TrainingText(train, languages)
  if args.corpus == 'tfds':
    return inputs.TfdsSentences(args.tfds_name, languages, args.split,
                                args.data_dir, args.max_sentences)
  if not args.input:
    raise SystemExit('--corpus=text needs --input=file1[,file2...]')
  sentences = []
  for path in args.input.split(','):
    with open(path, encoding='utf-8') as f:
      sentences.extend(line.strip() for line in f if line.strip())
  return sentences


def main(argv=None):
  args = _Args(sys.argv[1:] if argv is None else argv)
  languages = [l for l in args.languages.split(',') if l]
  sentences = _Sentences(args, languages)
  path = vocab.Train(sentences, args.output_prefix, args.vocab_size,
                     languages, args.model_type)
  print('wrote %s (%d tokens) from %d sentences' %
        (path, vocab.Vocab(path).size, len(sentences)))
  return path


if __name__ == '__main__':
  main()
