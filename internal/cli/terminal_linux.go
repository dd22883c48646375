package cli

import "golang.org/x/sys/unix"

// ioctlReadTermios reads a terminal's settings (isTerminal).
const ioctlReadTermios = unix.TCGETS
