//go:build !unix

package ingest

// openFileLimit is the process's limit on open files; 0: unknown.
func openFileLimit() uint64 { return 0 }
