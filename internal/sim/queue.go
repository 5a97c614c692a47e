package sim

import (
	"container/heap"
	"time"
)

// event is one entry of a discrete-event queue.
type event struct {
	at   time.Duration
	seq  int
	kind int
	name string
	gen  int
}

// queue orders events by time, then by the order they were pushed, so a run
// is deterministic.
type queue struct {
	items []*event
	seq   int
}

func (q *queue) Len() int { return len(q.items) }
func (q *queue) Less(i, j int) bool {
	a, b := q.items[i], q.items[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}
func (q *queue) Swap(i, j int) { q.items[i], q.items[j] = q.items[j], q.items[i] }
func (q *queue) Push(x any)    { q.items = append(q.items, x.(*event)) }
func (q *queue) Pop() any {
	n := len(q.items) - 1
	e := q.items[n]
	q.items = q.items[:n]
	return e
}

func (q *queue) push(at time.Duration, kind int, name string, gen int) {
	q.seq++
	heap.Push(q, &event{at: at, seq: q.seq, kind: kind, name: name, gen: gen})
}

func (q *queue) next() *event { return heap.Pop(q).(*event) }

func (q *queue) peek() *event { return q.items[0] }
