//go:build !linux

package admin

import "net"

// unread: see unread_linux.go; elsewhere it cannot be told.
func unread(net.Conn) (int, bool) { return 0, false }
