package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// etcdBackend is the Backend over a real etcd cluster.
type etcdBackend struct {
	cli *clientv3.Client
	log *zap.Logger
}

// NewEtcd connects to endpoints and proves that one of them answers a linearizable read within
// dialTimeout; otherwise it fails (clientv3.New alone dials lazily and would report nothing).
func NewEtcd(endpoints []string, dialTimeout time.Duration, log *zap.Logger) (Backend, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("cannot connect to etcd: no endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: dialTimeout,
		Logger:      log.Named("etcd-client"),
		// Keepalive pings make a dead TCP connection fail fast instead of hanging an RPC for
		// the kernel's timeout.
		DialKeepAliveTime:    dialTimeout,
		DialKeepAliveTimeout: dialTimeout,
		// gRPC's default reconnect backoff starts at 1 s and grows to 120 s: after an etcd
		// restart the first keepalive could then come later than the lease deadline, and the
		// broker would fail-stop although etcd was back within the session timeout. Retry a
		// lost connection every 100–500 ms instead.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: dialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("cannot connect to etcd (%v): %w", endpoints, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if _, err := cli.Get(clientv3.WithRequireLeader(ctx), "/kaas-reachability-probe", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("cannot reach etcd (%v) within %s: %w", endpoints, dialTimeout, err)
	}
	return &etcdBackend{cli: cli, log: log}, nil
}

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w (%v)", ErrLeaseNotFound, err)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w (%v)", ErrCompacted, err)
	}
	return err
}

// ttlSeconds rounds up: the server lease is then at least as long as the TTL the member
// computes its deadline from, never shorter.
func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

func (e *etcdBackend) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	r, err := e.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return 0, mapErr(err)
	}
	return LeaseID(r.ID), nil
}

func (e *etcdBackend) KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error) {
	// WithRequireLeader: a member cut off from the quorum must not count as renewed.
	r, err := e.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), clientv3.LeaseID(id))
	if err != nil {
		return 0, mapErr(err)
	}
	return time.Duration(r.TTL) * time.Second, nil
}

func (e *etcdBackend) Revoke(ctx context.Context, id LeaseID) error {
	_, err := e.cli.Revoke(ctx, clientv3.LeaseID(id))
	return mapErr(err)
}

func fromKV(k *mvccpb.KeyValue) KV {
	return KV{Key: string(k.Key), Value: k.Value, CreateRev: k.CreateRevision, ModRev: k.ModRevision, Lease: LeaseID(k.Lease)}
}

func (e *etcdBackend) Get(ctx context.Context, key string, prefix bool) ([]KV, int64, error) {
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	r, err := e.cli.Get(ctx, key, opts...)
	if err != nil {
		return nil, 0, mapErr(err)
	}
	out := make([]KV, len(r.Kvs))
	for i, kv := range r.Kvs {
		out[i] = fromKV(kv)
	}
	return out, r.Header.Revision, nil
}

func (e *etcdBackend) Txn(ctx context.Context, ifs []Compare, then []Op) (bool, int64, error) {
	cmps := make([]clientv3.Cmp, len(ifs))
	for i, c := range ifs {
		if c.Field == ModRevision {
			cmps[i] = clientv3.Compare(clientv3.ModRevision(c.Key), "=", c.Rev)
		} else {
			cmps[i] = clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.Rev)
		}
	}
	ops := make([]clientv3.Op, len(then))
	for i, o := range then {
		switch {
		case o.Delete && o.Prefix:
			ops[i] = clientv3.OpDelete(o.Key, clientv3.WithPrefix())
		case o.Delete:
			ops[i] = clientv3.OpDelete(o.Key)
		case o.Lease != 0:
			ops[i] = clientv3.OpPut(o.Key, string(o.Value), clientv3.WithLease(clientv3.LeaseID(o.Lease)))
		default:
			ops[i] = clientv3.OpPut(o.Key, string(o.Value))
		}
	}
	r, err := e.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, 0, mapErr(err)
	}
	return r.Succeeded, r.Header.Revision, nil
}

func (e *etcdBackend) Watch(ctx context.Context, prefix string, fromRev int64) <-chan WatchResponse {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV()}
	if fromRev > 0 {
		opts = append(opts, clientv3.WithRev(fromRev))
	}
	in := e.cli.Watch(ctx, prefix, opts...)
	out := make(chan WatchResponse)
	go func() {
		defer close(out)
		for wr := range in {
			r := WatchResponse{Rev: wr.Header.Revision}
			if err := wr.Err(); err != nil {
				if wr.CompactRevision != 0 {
					err = fmt.Errorf("%w (compacted at %d)", ErrCompacted, wr.CompactRevision)
				}
				r.Err = mapErr(err)
			}
			for _, ev := range wr.Events {
				x := Event{KV: fromKV(ev.Kv)}
				if ev.Type == clientv3.EventTypeDelete {
					x.Type = EventDelete
				}
				if ev.PrevKv != nil {
					p := fromKV(ev.PrevKv)
					x.Prev = &p
				}
				r.Events = append(r.Events, x)
			}
			if len(r.Events) == 0 && r.Err == nil {
				continue // progress notification
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
			if r.Err != nil {
				return
			}
		}
		if ctx.Err() == nil {
			// The client closed the stream under us (client closed): say so, so the caller
			// re-watches or stops instead of believing nothing changes.
			select {
			case out <- WatchResponse{Err: errors.New("etcd watch closed")}:
			case <-ctx.Done():
			}
		}
	}()
	return out
}

// Campaign runs a concurrency.Election under prefix in its own Session (lease of ttl, renewed
// by the session's stream). The leadership ends when the session's lease is lost, when the key
// is deleted, on Resign, or when ctx ends.
func (e *etcdBackend) Campaign(ctx context.Context, prefix string, value []byte, ttl time.Duration) (*Leadership, error) {
	sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(int(ttlSeconds(ttl))))
	if err != nil {
		return nil, fmt.Errorf("cannot open election session (%s): %w", prefix, mapErr(err))
	}
	el := concurrency.NewElection(sess, prefix)
	if err := el.Campaign(ctx, string(value)); err != nil {
		sess.Close()
		return nil, fmt.Errorf("cannot campaign (%s): %w", prefix, mapErr(err))
	}
	key, rev := el.Key(), el.Rev()
	done := make(chan struct{})
	var once sync.Once
	resign := func(rctx context.Context) error {
		var err error
		once.Do(func() {
			err = el.Resign(rctx)
			sess.Close()
		})
		return mapErr(err)
	}
	go func() {
		defer close(done)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w := e.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
		for {
			select {
			case <-sess.Done():
				return
			case <-ctx.Done():
				_ = resign(context.Background())
				return
			case wr, ok := <-w:
				if !ok {
					if ctx.Err() != nil {
						_ = resign(context.Background())
					}
					return
				}
				if wr.Err() != nil {
					return // cannot prove the key is still ours
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						return
					}
				}
			}
		}
	}()
	return &Leadership{Key: key, Rev: rev, Done: done, Resign: resign}, nil
}

func (e *etcdBackend) Close() error { return e.cli.Close() }

var _ Backend = (*etcdBackend)(nil)
