package binding

// SetEtcdBeforeSwap makes e run f between the read and the
// compare-and-swap of every update (tests of the swap's revision check).
func SetEtcdBeforeSwap(e *Etcd, f func()) { e.beforeSwap = f }
