#!/usr/bin/env bash
# PFLlib's Fashion-MNIST client folders (the FedALA authors' leaderboard, table pfllib-fmnist), written offline
# by PFLlib's own generator from Debian's dataset-fashion-mnist files (docs/datasets.md).
#
#   bash tools/pfllib_fmnist.sh DEST [PFLLIB]
#
# DEST: the folder that receives FashionMNIST-dir and FashionMNIST-pat (reproduce.py's --data-dir,
#       the tests' PFLLIB_DATA_DIR). PFLLIB: a checkout of TsingZ0/PFLlib (default: cloned into a
#       temporary folder); its files at commit d832e76 are read, yours is left as it is.
# Runs from any folder, leaves nothing behind but DEST/FashionMNIST-{dir,pat}, and skips a folder
# that is there already (run it twice: the second run does nothing). The generator's own imports
# (scikit-learn, ujson) go in a temporary venv that sees this Python's numpy, torch and torchvision.
set -euo pipefail
PFLLIB_COMMIT=d832e76
RAW=/usr/share/datasets/fashion-mnist
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash tools/pfllib_fmnist.sh DEST [PFLLIB]" >&2; exit 2
fi
mkdir -p "$1"
DEST=$(cd "$1" && pwd)
PYTHON=${PYTHON:-python3}
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$RAW/$f.gz" ] || { echo "error: $RAW/$f.gz is missing: apt-get install dataset-fashion-mnist" >&2; exit 2; }
done
todo=()
for p in dir pat; do
  if [ -f "$DEST/FashionMNIST-$p/config.json" ]; then
    echo "$DEST/FashionMNIST-$p is there already (skipped)"
  elif [ -e "$DEST/FashionMNIST-$p" ]; then
    echo "error: $DEST/FashionMNIST-$p exists without its config.json (a stopped run of this script?): remove it" >&2
    exit 2
  else
    todo+=("$p")
  fi
done
[ ${#todo[@]} -gt 0 ] || exit 0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
REPO=${2:-}
if [ -z "$REPO" ]; then
  REPO="$WORK/PFLlib.git" && git clone -q --bare https://github.com/TsingZ0/PFLlib "$REPO"
fi
mkdir "$WORK/PFLlib"  # only the generator and its utils/, as they are at the pinned commit (a checkout is not touched)
for f in dataset/generate_FashionMNIST.py dataset/utils/dataset_utils.py; do
  mkdir -p "$WORK/PFLlib/$(dirname "$f")" && git -C "$REPO" show "$PFLLIB_COMMIT:$f" > "$WORK/PFLlib/$f"
done
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q scikit-learn==1.9.1 ujson==6.1.0
for p in "${todo[@]}"; do
  # the generator writes into ./FashionMNIST/ under where it runs: one work folder per partition
  mkdir -p "$WORK/$p/FashionMNIST/rawdata/FashionMNIST/raw"
  cp "$WORK/PFLlib/dataset/generate_FashionMNIST.py" "$WORK/$p/" && cp -r "$WORK/PFLlib/dataset/utils" "$WORK/$p/"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    gunzip -c "$RAW/$f.gz" > "$WORK/$p/FashionMNIST/rawdata/FashionMNIST/raw/$f"
  done
  (cd "$WORK/$p" && "$WORK/venv/bin/python" generate_FashionMNIST.py noniid - "$p" > generate.log)
  mkdir "$WORK/$p/out" && mv "$WORK/$p/FashionMNIST/"{config.json,train,test} "$WORK/$p/out/"
  mv "$WORK/$p/out" "$DEST/FashionMNIST-$p"  # whole or not at all
  echo "wrote $DEST/FashionMNIST-$p"
done
