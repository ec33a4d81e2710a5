# Sourced by the scripts that install Debian packages (bootstrap.sh, rdma-vm.sh).
#
# apt_install WHO PKG...: installs PKG... quietly; on failure prints what apt and dpkg said (the
# tail of their log) and the free space of the disks they write to, repairs an interrupted dpkg
# (`dpkg --configure -a`, `apt-get -f install`) and tries once more, so a CI log names the cause
# instead of a bare "dpkg returned an error code".
apt_install() {
  local who=$1; shift
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
  local log; log=$(mktemp)
  echo "$who: installing $*" >&2
  local try
  for try in 1 2; do
    if $sudo apt-get update -qq >"$log" 2>&1 &&
       DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >>"$log" 2>&1; then
      rm -f "$log"; return 0
    fi
    echo "$who: apt-get install $* failed (try $try of 2); its last lines:" >&2
    tail -n 25 "$log" | sed 's/^/  | /' >&2
    echo "$who: free space:" >&2
    df -h / /var /tmp 2>/dev/null | sed 's/^/  | /' >&2
    [[ $try -eq 2 ]] && break
    echo "$who: repairing dpkg's state, then trying again" >&2
    DEBIAN_FRONTEND=noninteractive $sudo dpkg --configure -a >>"$log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -f install -y -qq >>"$log" 2>&1 || true
    $sudo apt-get clean >/dev/null 2>&1 || true
  done
  rm -f "$log"
  echo "$who: could not install $*; fix the cause above, then run this again" >&2
  return 1
}
