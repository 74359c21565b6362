//go:build !linux

package proxy

import "errors"

// dupSocket is unused where there is no parking (idlepark.ErrUnsupported).
func dupSocket(int) (int, error) { return -1, errors.ErrUnsupported }
