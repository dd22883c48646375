package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DirLock holds a demo's directory for one run: a second demo on the
// same directory would empty the broker data and the state of the one
// that runs.
type DirLock struct{ f *os.File }

// LockDir creates dir and locks it for one demo run, or says that another
// demo holds it.
func LockDir(dir string) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("demo: %s is in use by another meterline demo; give this one its own --dir", dir)
		}
		return nil, fmt.Errorf("demo: lock %s: %w", dir, err)
	}
	return &DirLock{f: f}, nil
}

// Close releases the directory.
func (l *DirLock) Close() error { return l.f.Close() }
