# Sourced by the benchmark scripts that run PyTorch beside membill.
#
# same_blas BW_JSON COMMAND...: runs COMMAND with the OpenBLAS kernels membill's products ran
# with. PyTorch 1.13 (Debian's) links the same OpenBLAS; where membill chose its kernels by the
# CPU's features (OpenBLAS fell back to Prescott's for a CPU model it does not know), PyTorch is
# given the same ones, named in OPENBLAS_CORETYPE, so that the two compare on equal kernels.
same_blas() {
  local core
  core=$(python3 -c 'import json, sys; b = json.load(open(sys.argv[1]))
print(b["blas_core"] if b.get("blas_core_by") == "CPU features" else "")' "$1")
  shift
  if [ -n "$core" ]; then OPENBLAS_CORETYPE="$core" "$@"; else "$@"; fi
}
