package agent

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// TailBuffer is an io.Writer that keeps only the last N bytes written to it
// (a ring buffer). It is safe for concurrent use.
type TailBuffer struct {
	mu    sync.Mutex
	buf   []byte
	w     int // next write position
	full  bool
	total int64
}

// NewTailBuffer returns a buffer keeping the last n bytes (n <= 0 keeps none).
func NewTailBuffer(n int) *TailBuffer {
	return &TailBuffer{buf: make([]byte, max(n, 0))}
}

// Write keeps the tail of p; it never fails.
func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	n := len(t.buf)
	if n == 0 {
		return len(p), nil
	}
	if len(p) >= n {
		copy(t.buf, p[len(p)-n:])
		t.w, t.full = 0, true
		return len(p), nil
	}
	k := copy(t.buf[t.w:], p)
	if k < len(p) {
		copy(t.buf, p[k:])
	}
	if t.w+len(p) >= n {
		t.full = true
	}
	t.w = (t.w + len(p)) % n
	return len(p), nil
}

// Bytes returns a copy of the kept bytes, oldest first.
func (t *TailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.full {
		return append([]byte(nil), t.buf[:t.w]...)
	}
	out := make([]byte, 0, len(t.buf))
	out = append(out, t.buf[t.w:]...)
	return append(out, t.buf[:t.w]...)
}

// Total returns how many bytes were ever written.
func (t *TailBuffer) Total() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// String returns the kept bytes as valid UTF-8 (protobuf strings must be):
// a rune cut by the ring's start is dropped, and invalid bytes become U+FFFD.
func (t *TailBuffer) String() string {
	b := t.Bytes()
	if int64(len(b)) < t.Total() {
		for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
