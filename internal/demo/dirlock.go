package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DirLock holds a demo's directory for one run: a second demo on the
// same directory would empty the broker data and the state of the one
// that runs.
type DirLock struct{ f *os.File }

// LockDir creates dir and locks it for one demo run, or says that another
// demo holds it. It refuses a dir that holds a kafka or state directory
// with files in it but no lock file or demo.log: no demo made them (--dir
// . where the stages keep their state in state/), and the run would
// delete them.
func LockDir(dir string) (*DirLock, error) {
	if err := refuseOthersFiles(dir); err != nil {
		return nil, err
	}
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

// refuseOthersFiles returns an error when dir has neither a lock file nor
// a demo.log, so no demo ran in it, yet one of the directories a run
// empties (startBroker) has files in it. `meterline demo` writes demo.log
// in every run, those of versions that kept no lock file included.
func refuseOthersFiles(dir string) error {
	for _, mark := range []string{"lock", "demo.log"} {
		if _, err := os.Stat(filepath.Join(dir, mark)); err == nil {
			return nil
		}
	}
	for _, sub := range emptiedDirs {
		path := filepath.Join(dir, sub)
		if entries, err := os.ReadDir(path); err == nil && len(entries) > 0 {
			return fmt.Errorf("demo: %s holds files no meterline demo made (%s has no demo lock file or demo.log), and a demo empties its %s directories "+
				"at start: give the demo a --dir of its own", path, dir, strings.Join(emptiedDirs, " and "))
		}
	}
	return nil
}

// emptiedDirs are the directories of a demo's Dir emptied at the start of
// each run: the embedded broker's data and the Pebble state.
var emptiedDirs = []string{"kafka", "state"}
