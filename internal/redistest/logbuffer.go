package redistest

import (
	"bytes"
	"sync"
)

// LogBuffer is a log's destination that goroutines write while a test
// reads it (a slog handler's output, or a redis-server's own output).
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail is the last n bytes written.
func (l *LogBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	data := l.b.Bytes()
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}
