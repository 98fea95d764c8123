package server

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/credentials"
)

// BenchmarkProduceOverListeners is what TLS and SASL cost on a produce workload: one in-process
// broker with PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512) listeners, franz-go producing 1 KiB
// records (acks=all, idempotent, linger 0) through each in turn; run with -count=3 so the
// listeners alternate. Per-ack fsync is off (log.flush.interval.messages=100000) so the network
// path, not the disk, is what is measured. SASL costs once per connection, so SASL_SSL differs
// from SSL only by noise.
func BenchmarkProduceOverListeners(b *testing.B) {
	pki := newTestPKI(b)
	dir := b.TempDir()
	cert, key := pki.issue(pkixName("broker-0"), true)
	cfg := configs.Default()
	cfg.Listeners = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
	cfg.SSLKeystoreChain, cfg.SSLKeystoreKey = string(cert), string(key)
	cfg.MetricsAddr, cfg.DataDir, cfg.NumEventLoops = "", dir, 2
	cfg.LogFlushIntervalMsgs = 100000
	br, err := StartBroker(cfg, zap.NewNop(), BrokerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close() })
	cred, err := credentials.FromPassword(credentials.SHA512, "pw", 4096)
	if err != nil {
		b.Fatal(err)
	}
	if err := br.Server.deps.Credentials.Apply([]credentials.Change{{User: "bench", Mechanism: credentials.SHA512, Cred: cred}}); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	for _, ln := range []string{"PLAINTEXT", "SSL", "SASL_SSL"} {
		b.Run(ln, func(b *testing.B) {
			opts := []kgo.Opt{kgo.SeedBrokers(br.Server.ListenerAddr(ln).String()), kgo.ProducerLinger(0),
				kgo.AllowAutoTopicCreation(), kgo.MaxBufferedRecords(10000)}
			if ln != "PLAINTEXT" {
				opts = append(opts, kgo.DialTLSConfig(pki.clientTLS(nil)))
			}
			if ln == "SASL_SSL" {
				opts = append(opts, kgo.SASL(mechanism("SCRAM-SHA-512", "bench", "pw")))
			}
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			topic := "bench-" + ln
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: value}).FirstErr(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(value)))
			b.ReportAllocs()
			b.ResetTimer()
			errs := make(chan error, 1)
			for i := 0; i < b.N; i++ {
				cl.Produce(ctx, &kgo.Record{Topic: topic, Value: value}, func(_ *kgo.Record, err error) {
					if err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				})
			}
			if err := cl.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
		})
	}
}
