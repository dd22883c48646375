package stream

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap/zaptest"
)

// holdStateEnv names the directory whose store TestHoldStateDir keeps open
// in a process of its own.
const holdStateEnv = "METERLINE_TEST_HOLD_STATE_DIR"

// TestHoldStateDir is not a test: run by TestStateDirInUse in a process of
// its own, it opens the store in the directory holdStateEnv names, says
// so on stdout and keeps it open until its stdin closes.
func TestHoldStateDir(t *testing.T) {
	dir := os.Getenv(holdStateEnv)
	if dir == "" {
		return
	}
	s, err := OpenStore(dir, vfs.Default, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Stdout.WriteString("open\n")
	_, _ = os.Stdin.Read(make([]byte, 1))
}

// TestStateDirInUse: two processes of one stage given the same
// --instance-id and --state-dir (each instance keeps its state in
// <state-dir>/<stage>-<instance-id>) would share one store. Pebble's lock
// refuses the second; its error must say what happened and what to do,
// not only the system's "resource temporarily unavailable".
func TestStateDirInUse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dedup-d1")
	holdInChild(t, "TestHoldStateDir", holdStateEnv, dir, "open")

	s, err := OpenStore(dir, vfs.Default, zaptest.NewLogger(t))
	if err == nil {
		s.Close()
		t.Fatal("opened a state directory another process has open")
	}
	for _, want := range []string{dir, "another process", "--instance-id", "--state-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// deniedFS is the filesystem of a process whose user may not write the
// state directory's parent (mkdirDenied) or the state directory itself
// (a LOCK file left by a run as another user): what the OS returns there,
// EACCES from mkdir or from opening the lock file, given as
// os.MkdirAll and os.Create give it.
type deniedFS struct {
	vfs.FS
	mkdirDenied bool
}

func (fs deniedFS) MkdirAll(dir string, perm os.FileMode) error {
	if fs.mkdirDenied {
		return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.EACCES}
	}
	return fs.FS.MkdirAll(dir, perm)
}

func (fs deniedFS) Lock(name string) (io.Closer, error) {
	return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
}

// TestStateDirNotWritable: a state directory this process's user may not
// write (made by a run as root, a volume mounted for another user) is a
// permission problem, and the error must say so. EACCES is also what
// fcntl may return for a lock another process holds, but from the lock
// call, not from mkdir or from opening the lock file: told "in use by
// another process ... give each instance its own --instance-id", the
// operator would look for an instance that does not exist.
func TestStateDirNotWritable(t *testing.T) {
	for _, mkdirDenied := range []bool{true, false} {
		dir := filepath.Join(t.TempDir(), "state", "dedup-d1")
		s, err := OpenStore(dir, deniedFS{FS: vfs.Default, mkdirDenied: mkdirDenied}, zaptest.NewLogger(t))
		if err == nil {
			s.Close()
			t.Fatal("opened a state directory the filesystem refuses")
		}
		if !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), dir) {
			t.Errorf("mkdir denied %v: error %q does not name the directory and the permission problem", mkdirDenied, err)
		}
		for _, wrong := range []string{"another process", "--instance-id"} {
			if strings.Contains(err.Error(), wrong) {
				t.Errorf("mkdir denied %v: error %q blames %q", mkdirDenied, err, wrong)
			}
		}
	}
}
