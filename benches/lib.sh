# Helpers the side-by-side benchmark scripts share (compressed.sh, nested.sh); sourced, not run.

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }   # secs START END: the seconds between two `now`s
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
status_kib() { awk -v key="$1:" '$1 == key {print $2}' "/proc/$2/status"; }   # status_kib VmHWM PID
