package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// TablesWithin returns the sstables of db whose every key lies in
// [lo, hi): their file numbers and sizes.
func TablesWithin(t testing.TB, db *pebble.DB, lo, hi []byte) map[uint64]uint64 {
	t.Helper()
	out := map[uint64]uint64{}
	for _, f := range sstables(t, db) {
		if bytes.Compare(f.Smallest.UserKey, lo) >= 0 && bytes.Compare(f.Largest.UserKey, hi) < 0 {
			out[uint64(f.FileNum)] = f.Size
		}
	}
	return out
}

// sstables lists the sstables of every level of db.
func sstables(t testing.TB, db *pebble.DB) []pebble.SSTableInfo {
	t.Helper()
	levels, err := db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []pebble.SSTableInfo
	for _, level := range levels {
		out = append(out, level...)
	}
	return out
}

// WaitTablesGone waits until none of tables (TablesWithin) is in db's
// list of sstables or a file in dir, and returns how long that took; it
// fails the test if one still is after wait. what says what the tables
// held.
func WaitTablesGone(t testing.TB, db *pebble.DB, dir string, tables map[uint64]uint64, wait time.Duration, what string) time.Duration {
	t.Helper()
	var size uint64
	for _, n := range tables {
		size += n
	}
	// left counts the tables still in db's list or still on disk.
	left := func() int {
		there := map[uint64]bool{}
		for _, f := range sstables(t, db) {
			if _, ok := tables[uint64(f.FileNum)]; ok {
				there[uint64(f.FileNum)] = true
			}
		}
		for num := range tables {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("%06d.sst", num))); err == nil {
				there[num] = true
			}
		}
		return len(there)
	}
	start := time.Now()
	for n := left(); n > 0; n = left() {
		if time.Since(start) > wait {
			t.Fatalf("%d of the %d tables (%d bytes) that hold only %s are still in the DB or on disk %s after",
				n, len(tables), size, what, wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}
