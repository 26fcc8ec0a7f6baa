#!/usr/bin/env bash
# Build (once per version) and run helm from the Go module proxy; no release tarball needed.
#
#   deploy/kubernetes/helm.sh build          build helm into ~/.cache/fleetpulse/helm/<version>/ (~2-4 min first time)
#   deploy/kubernetes/helm.sh path           print the cached binary's path (builds it if missing)
#   deploy/kubernetes/helm.sh ARGS...        run helm ARGS... (e.g. lint deploy/helm/fleetpulse)
#
# Env: HELM_VERSION (default v3.19.5), HELM_NICE (default 10), GO (default: go on PATH).
# The cache is outside the work tree so every clone on this machine reuses it.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
NICE="${HELM_NICE:-10}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
DIR="${HELM_CACHE:-$HOME/.cache/fleetpulse/helm}/$HELM_VERSION"
HELM="$DIR/helm"

log() { printf 'helm.sh: %s\n' "$*" >&2; }
die() { printf 'helm.sh: error: %s\n' "$*" >&2; exit 1; }
[[ "$HELM_VERSION" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "HELM_VERSION must look like v3.19.5, got '$HELM_VERSION'"

build() {
  [[ -x "$HELM" ]] && return 0
  [[ -x "$GO" ]] || die "go not found: install Go or set GO"
  mkdir -p "$DIR"
  local t0; t0=$(date +%s)
  log "building helm $HELM_VERSION from the Go module proxy"
  # helm's go.mod has no replace directives, so `go install module@version` works as is.
  # The -X flags do what helm's Makefile does: the real version for `helm version`, and the
  # Kubernetes version of its client-go as the default for `helm template` / `lint`
  # (without them helm assumes v1.20 and refuses a chart's kubeVersion >= 1.27)
  local gomod k8s_minor flags
  gomod="$("$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  k8s_minor="$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$gomod")"
  [[ "$k8s_minor" =~ ^[0-9]+$ ]] || die "cannot read helm's k8s.io/client-go version from $gomod"
  flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  CGO_ENABLED=0 GOBIN="$DIR/.bin" nice -n "$NICE" "$GO" install -trimpath -ldflags "$flags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$DIR/.bin/helm" "$HELM"; rmdir "$DIR/.bin" 2>/dev/null || true
  log "built $HELM in $(( $(date +%s) - t0 )) s"
}

case "${1:-}" in
  build) build ;;
  path) build; echo "$HELM" ;;
  -h|--help|help|"") sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) build; exec "$HELM" "$@" ;;
esac
