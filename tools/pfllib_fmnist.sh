#!/usr/bin/env bash
# PFLlib's Fashion-MNIST client folders (the FedALA authors' leaderboard, table pfllib-fmnist), written offline
# by PFLlib's own generator from Debian's dataset-fashion-mnist files (docs/datasets.md).
#
#   bash tools/pfllib_fmnist.sh DEST [PFLLIB]
#
# DEST: the folder that receives FashionMNIST-dir and FashionMNIST-pat (reproduce.py's --data-dir,
#       the tests' PFLLIB_DATA_DIR). PFLLIB: a clone of TsingZ0/PFLlib (default: cloned into a
#       temporary folder, which needs the network); its files at commit d832e76 are read, yours is left as it is.
# Runs from any folder, leaves nothing behind but DEST/FashionMNIST-{dir,pat}, and skips a folder
# that is there already (run it twice: the second run does nothing). Each folder is copied into DEST as
# .FashionMNIST-P.partial and then renamed: whole or not there; what a killed run left is removed first. Run it from the project's
# environment (an activated virtual environment or a plain interpreter): the generator runs in a
# temporary venv (tools/pfllib_venv.py) that sees this Python's numpy, torch and torchvision and
# adds only the generator's own imports, pinned. Bad input, no clone or no network: one line, exit status 2.
# For tests only: PFLLIB_COMMIT (another commit or ref to read), PFLLIB_GENERATOR_PACKAGES (what pip
# installs; empty: nothing) and PFLLIB_FMNIST_RAW (another folder of the four .gz files) change what is
# read and installed; the fingerprints of docs/datasets.md are those of the defaults.
set -euo pipefail
PFLLIB_COMMIT=${PFLLIB_COMMIT:-d832e76f6a23b833038949ec1e4fdefe63a4d350}
PACKAGES=${PFLLIB_GENERATOR_PACKAGES-scikit-learn==1.9.1 ujson==6.1.0}
RAW=${PFLLIB_FMNIST_RAW:-/usr/share/datasets/fashion-mnist}  # the four idx files, .gz
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "error: $*" >&2; exit 2; }
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ -z "$1" ]; then
  fail "usage: bash tools/pfllib_fmnist.sh DEST [PFLLIB]"
fi
PYTHON=${PYTHON:-$(command -v python3 || command -v python || true)}
[ -n "$PYTHON" ] || fail "no python3 or python on PATH: activate the project's environment"
DEST=$("$PYTHON" -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$1")
[ ! -e "$DEST" ] || [ -d "$DEST" ] || fail "$DEST is not a folder"
above=$DEST
while [ ! -e "$above" ]; do above=$(dirname "$above"); done
[ -d "$above" ] && [ -w "$above" ] || fail "$above is not a folder you can write to: give another DEST"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$RAW/$f.gz" ] || fail "$RAW/$f.gz is missing: apt-get install dataset-fashion-mnist"
done
todo=()
for p in dir pat; do
  if [ -f "$DEST/FashionMNIST-$p/config.json" ]; then
    echo "$DEST/FashionMNIST-$p is there already (skipped)"
  elif [ -e "$DEST/FashionMNIST-$p" ]; then
    fail "$DEST/FashionMNIST-$p exists without its config.json (a stopped run of this script?): remove it"
  else
    todo+=("$p")
  fi
done
[ ${#todo[@]} -gt 0 ] || exit 0
for p in "${todo[@]}"; do  # what a killed run left between its two renames: never taken for output or moved into
  if [ -e "$DEST/.FashionMNIST-$p.partial" ] || [ -L "$DEST/.FashionMNIST-$p.partial" ]; then
    rm -rf "$DEST/.FashionMNIST-$p.partial" 2> /dev/null \
      || fail "cannot remove $DEST/.FashionMNIST-$p.partial, left by a killed run: remove it yourself"
    echo "removed $DEST/.FashionMNIST-$p.partial (left by a killed run)"
  fi
done
REPO=${2:-}
if [ -n "$REPO" ]; then
  [ -d "$REPO" ] || fail "$REPO is not a folder: give a clone of TsingZ0/PFLlib"
  REPO=$(cd "$REPO" && pwd)
  git -C "$REPO" rev-parse -q --verify "$PFLLIB_COMMIT^{commit}" > /dev/null 2>&1 \
    || fail "$REPO is no clone of TsingZ0/PFLlib holding commit $PFLLIB_COMMIT (git -C $REPO fetch, or clone it anew)"
fi
WORK=$(mktemp -d -t pfllib-fmnist.XXXXXXXX)
trap 'rm -rf "$WORK" "$DEST"/.FashionMNIST-*.partial' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -z "$REPO" ]; then
  REPO="$WORK/PFLlib.git"
  GIT_TERMINAL_PROMPT=0 git clone -q --bare https://github.com/TsingZ0/PFLlib "$REPO" 2> "$WORK/clone.log" \
    || fail "cloning https://github.com/TsingZ0/PFLlib failed ($(tail -n 1 "$WORK/clone.log")): without the network, give a clone: bash tools/pfllib_fmnist.sh DEST path/to/PFLlib"
fi
mkdir "$WORK/PFLlib"  # only the generator and its utils/, as they are at the pinned commit (a checkout is not touched)
for f in dataset/generate_FashionMNIST.py dataset/utils/dataset_utils.py; do
  mkdir -p "$WORK/PFLlib/$(dirname "$f")"
  git -C "$REPO" show "$PFLLIB_COMMIT:$f" > "$WORK/PFLlib/$f" 2> /dev/null \
    || fail "$REPO has no $f at commit $PFLLIB_COMMIT"
done
# shellcheck disable=SC2086  # PACKAGES is a list of words
"$PYTHON" "$HERE/pfllib_venv.py" "$WORK/venv" $PACKAGES > /dev/null || exit 2
for p in "${todo[@]}"; do
  # the generator writes into ./FashionMNIST/ under where it runs: one work folder per partition
  mkdir -p "$WORK/$p/FashionMNIST/rawdata/FashionMNIST/raw"
  cp "$WORK/PFLlib/dataset/generate_FashionMNIST.py" "$WORK/$p/" && cp -r "$WORK/PFLlib/dataset/utils" "$WORK/$p/"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    if ! said=$(gunzip -c "$RAW/$f.gz" 2>&1 > "$WORK/$p/FashionMNIST/rawdata/FashionMNIST/raw/$f"); then
      gzip -t "$RAW/$f.gz" 2> /dev/null || fail "$RAW/$f.gz is no readable gzip file: apt-get install --reinstall dataset-fashion-mnist"
      echo "error: cannot unpack $RAW/$f.gz into $WORK (${said##*$'\n'}); nothing was written to $DEST" >&2
      exit 1
    fi
  done
  if ! (cd "$WORK/$p" && "$WORK/venv/bin/python" generate_FashionMNIST.py noniid - "$p" > generate.log 2>&1); then
    echo "error: PFLlib's generate_FashionMNIST.py noniid - $p failed: $(tail -n 1 "$WORK/$p/generate.log")" >&2
    exit 1
  fi
  mkdir "$WORK/$p/out" && mv "$WORK/$p/FashionMNIST/"{config.json,train,test} "$WORK/$p/out/"
  mkdir -p "$DEST"
  rm -rf "$DEST/.FashionMNIST-$p.partial"  # never moved into: the copy below makes it anew
  # a copy (WORK may be another file system), then a rename: DEST/FashionMNIST-$p is whole or not there
  said=$(mv "$WORK/$p/out" "$DEST/.FashionMNIST-$p.partial" 2>&1) || {
    echo "error: cannot write $DEST/.FashionMNIST-$p.partial (${said##*$'\n'}); $DEST/FashionMNIST-$p was not made" >&2
    exit 1; }
  said=$("$PYTHON" -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' \
         "$DEST/.FashionMNIST-$p.partial" "$DEST/FashionMNIST-$p" 2>&1) || {  # never into a folder there
    echo "error: cannot rename $DEST/.FashionMNIST-$p.partial to $DEST/FashionMNIST-$p (${said##*$'\n'}); it was not made" >&2
    exit 1; }
  echo "wrote $DEST/FashionMNIST-$p"
done
