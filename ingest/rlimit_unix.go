//go:build unix

package ingest

import "syscall"

// openFileLimit is the process's limit on open files (RLIMIT_NOFILE, its
// soft limit, which Go raises to the hard one at start); 0 when unknown.
func openFileLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur <= 0 || uint64(l.Cur) >= 1<<62 { // 1<<62: no limit
		return 0
	}
	return uint64(l.Cur)
}
