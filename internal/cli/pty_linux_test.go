package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// openPTY opens a pseudo-terminal and returns its terminal side, closed
// with its controlling side at the end of the test.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	var n, unlock uint32
	if err := ioctl(ptmx, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	if err := ioctl(ptmx, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("the pseudo-terminal's number: %v", err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

func ioctl(f *os.File, req uint, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// TestOSIOSeesATerminal: OSIO tells a terminal on standard input and on
// standard error (a pseudo-terminal here) from a pipe and from /dev/null,
// a character device that is no terminal; `entitlements set < /dev/null`
// does not say that it reads the document from a terminal.
func TestOSIOSeesATerminal(t *testing.T) {
	savedIn, savedErr := os.Stdin, os.Stderr
	t.Cleanup(func() { os.Stdin, os.Stderr = savedIn, savedErr })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for _, c := range []struct {
		name     string
		in, err  *os.File
		terminal bool
	}{{"a pseudo-terminal", openPTY(t), openPTY(t), true}, {"a pipe", r, w, false}, {os.DevNull, null, null, false}} {
		os.Stdin, os.Stderr = c.in, c.err
		stdio := OSIO()
		os.Stdin, os.Stderr = savedIn, savedErr
		if stdio.StdinIsTerminal != c.terminal {
			t.Errorf("OSIO with %s on stdin: StdinIsTerminal %v, want %v", c.name, stdio.StdinIsTerminal, c.terminal)
		}
		if stdio.StderrIsTerminal != c.terminal {
			t.Errorf("OSIO with %s on stderr: StderrIsTerminal %v, want %v", c.name, stdio.StderrIsTerminal, c.terminal)
		}
	}

	os.Stdin = null
	stdio := OSIO()
	os.Stdin = savedIn
	var out, errb bytes.Buffer
	stdio.Stdout, stdio.Stderr = &out, &errb
	code := Main(context.Background(), []string{"entitlements", "set", "--validate"}, stdio)
	if code == 0 {
		t.Errorf("entitlements set --validate < /dev/null: exit 0, want a failure (no document)\n%s%s", out.String(), errb.String())
	}
	if strings.Contains(errb.String(), readingTerminal) {
		t.Errorf("entitlements set --validate < /dev/null says %q:\n%s", readingTerminal, errb.String())
	}
}
