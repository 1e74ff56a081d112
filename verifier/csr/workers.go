package csr

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// DefaultWorkers is how many objects a controller here handles at once.
// Each decision costs API round trips (the approver reads the node's
// binding and writes the approval, the reaper deletes a token): handled
// one at a time in the informer's callback, a boot storm's CSRs queued
// behind each other's round trips during a boot storm.
const DefaultWorkers = 8

// workers returns n, or DefaultWorkers when n is not positive.
func workers(n int) int {
	if n <= 0 {
		return DefaultWorkers
	}
	return n
}

// informerFactory is shared when the controller was given one, so the
// approver and the reaper of one verifier hold one CSR watch between them
// (each watch event is sent, decoded and cached once, not twice). Without
// one, the controller makes its own; done shuts down a factory the
// controller made, and leaves a shared one to its owner.
func informerFactory(shared informers.SharedInformerFactory, c kubernetes.Interface, resync time.Duration) (f informers.SharedInformerFactory, done func()) {
	if shared != nil {
		return shared, func() {}
	}
	f = informers.NewSharedInformerFactory(c, resync)
	return f, f.Shutdown
}

// runQueued feeds the keys of inf's added and updated objects to n
// workers, which call handle with the object as the informer's cache has
// it then. A key queued again while waiting is handled once; one key is
// never handled by two workers at once (client-go's workqueue). It
// returns when ctx ends and the workers are done.
func runQueued(ctx context.Context, inf cache.SharedIndexInformer, n int, handle func(ctx context.Context, obj any)) error {
	q := workqueue.NewTyped[string]()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			q.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range workers(n) {
		wg.Go(func() {
			for {
				key, quit := q.Get()
				if quit {
					return
				}
				if obj, ok, err := inf.GetIndexer().GetByKey(key); err == nil && ok {
					handle(ctx, obj)
				}
				q.Done(key)
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
	return nil
}

// logSynced logs "informers synced" once every informer has listed, and
// nothing when ctx ends first. Until then the controller decides nothing
// from its cache; the line tells an operator (and the boot-storm
// benchmark, which starts its storm on it) that this replica now does.
func logSynced(ctx context.Context, log *slog.Logger, synced ...cache.InformerSynced) {
	if cache.WaitForCacheSync(ctx.Done(), synced...) {
		log.Info(msgInformersSynced)
	}
}

// msgInformersSynced is logSynced's message.
const msgInformersSynced = "informers synced"
