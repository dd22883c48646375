//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package cli

import "golang.org/x/sys/unix"

// ioctlReadTermios reads a terminal's settings (isTerminal).
const ioctlReadTermios = unix.TIOCGETA
