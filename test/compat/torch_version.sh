#!/usr/bin/env bash
# Builds libsmddp's torch backend against another torch, in a venv of its own,
# and runs the pytest suite (test/python) with it:
#
#   bash test/compat/torch_version.sh VERSION [pytest arguments]
#   bash test/compat/torch_version.sh 2.14.1
#   bash test/compat/torch_version.sh 2.14.1 test/python/test_backend.py -k gather
#
# Everything lives under build-compat/torch-VERSION/: venv/ (python3 -m venv,
# without the system's site-packages, so the system's torch cannot leak in),
# build/ (meson, werror, the shim built against the venv's torch headers) and
# pkg/smddp/ (the package from plugin/python with the built _C and
# libsmddp.so beside it, put on PYTHONPATH). torch==VERSION is installed only
# here, by name: the venv may take several GB (2.14.1 comes as a CUDA build
# with its nvidia packages). The package is not pip-installed, so the tests
# of torch's entry-point autoload skip, and say so.
#
# Ends with one line: "torch_version.sh: torch VERSION: <pytest's summary>".
# Exit status: pytest's, or 1 when the venv or the build cannot be made, or
# when pytest ran no test (its status 5).
set -uo pipefail
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    echo "usage: bash test/compat/torch_version.sh VERSION [pytest arguments]   (e.g. 2.14.1)" >&2
    exit 2
fi
version=$1
shift
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?([a-z0-9+.]*)$ ]]; then
    echo "torch_version.sh: '$version' is not a torch version (accepted: like 2.13.0 or 2.14.1)" >&2
    exit 2
fi
cd "$(dirname "$0")/../.."
root=$PWD
dir=build-compat/torch-$version
venv=$dir/venv
py=$venv/bin/python
say() { echo "torch_version.sh: $*"; }

mkdir -p "$dir"
if [ ! -x "$py" ]; then
    python3 -m venv "$venv" || { say "cannot make a venv in $venv"; exit 1; }
fi
have=$("$py" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)
if [ "$have" != "$version" ]; then
    say "installing torch==$version into $venv (may download several GB)"
    "$py" -m pip install -q --disable-pip-version-check "torch==$version" \
        || { say "pip could not install torch==$version"; exit 1; }
fi
for mod in meson ninja pytest numpy; do
    "$py" -c "import $mod" 2>/dev/null \
        || "$py" -m pip install -q --disable-pip-version-check "$mod" \
        || { say "pip could not install $mod"; exit 1; }
done
tv=$("$py" -c "import torch; print(torch.__version__)")
say "torch $tv from $venv"

# meson and the Python it finds come from the venv, so the shim is built
# against the venv's torch.
export PATH=$root/$venv/bin:$PATH
if [ ! -f "$dir/build/build.ninja" ]; then
    meson setup "$dir/build" -Dwerror=true -Dofi=enabled -Dcmocka=disabled -Dtorch=enabled \
        > "$dir/setup.log" 2>&1 || { tail -30 "$dir/setup.log"; say "meson setup failed ($dir/setup.log)"; exit 1; }
fi
meson compile -C "$dir/build" > "$dir/compile.log" 2>&1 \
    || { grep -E "error|FAILED" "$dir/compile.log" | head -30; say "the build failed against torch $tv ($dir/compile.log)"; exit 1; }
so=$(ls "$dir"/build/plugin/torch/_C*.so 2>/dev/null | head -1)
lib=$dir/build/plugin/torch/libsmddp.so
[ -n "$so" ] && [ -e "$lib" ] || { say "the build made no _C module or libsmddp.so"; exit 1; }

rm -rf "$dir/pkg"
mkdir -p "$dir/pkg/smddp"
for f in plugin/python/smddp/*; do
    ln -s "$root/$f" "$dir/pkg/smddp/$(basename "$f")"
done
ln -s "$root/$so" "$dir/pkg/smddp/$(basename "$so")"
ln -s "$root/$lib" "$dir/pkg/smddp/libsmddp.so"

export PYTHONPATH=$root/$dir/pkg
"$py" -c "import smddp, torch.distributed as dist; assert smddp.is_registered(), 'not registered'" \
    || { say "smddp does not load with torch $tv"; exit 1; }
[ $# -gt 0 ] || set -- test/python
log=$dir/pytest.log
"$py" -m pytest -q -rs "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(grep -E "^=*[ ]*[0-9]+ (passed|failed|skipped|error)|no tests ran" "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
if [ "$rc" -eq 5 ]; then
    say "torch $tv: pytest ran no test"
    exit 1
fi
say "torch $tv: ${summary:-no pytest summary (exit $rc)}"
exit "$rc"
