package pipeline

// Complete is a pipeline's complete step: until outcomes is closed, it
// calls write with the next outcome and whatever else has arrived
// meanwhile (at most maxBatch in all), so outcomes that finish while a
// write runs share the next one, and after each write signals w's Room
// (on an ordered topic the messages behind those written may be free to
// claim now). write must not keep the slice.
func Complete[T any](outcomes <-chan T, w *Window, maxBatch int, write func([]T)) {
	batch := make([]T, 0, maxBatch)
	for o := range outcomes {
		batch = append(batch[:0], o)
	gather:
		for len(batch) < maxBatch {
			select {
			case o, ok := <-outcomes:
				if !ok {
					break gather
				}
				batch = append(batch, o)
			default:
				break gather
			}
		}
		write(batch)
		clear(batch) // drop references to what was written
		w.Signal()
	}
}
