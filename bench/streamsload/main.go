// Command streamsload is the Go half of bench/perf-streams.sh: the Kafka Streams EOS count
// application of the e2e tests (cmd/kaas/testdata/streams-app) run against a broker, timed.
//
//	streamsload produce --brokers 127.0.0.1:9092 --in IN --out OUT --keys 1000 --per-key 1000
//	streamsload wait    --brokers 127.0.0.1:9092 --out OUT --keys 1000 --per-key 1000
//
// produce creates the input and output topics and writes keys × per-key records (String keys
// k00000…, String values), untimed. wait reads the output read_committed from the start, keeping
// the last count of each key, and returns once every key's count is per-key: the moment the
// application has processed and committed the whole input exactly once. Its last stdout line is
// one JSON object with the seconds it waited and the committed output records it read (fewer
// than the input when the app's record cache merges updates).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "produce" && os.Args[1] != "wait") {
		fmt.Fprintln(os.Stderr, "usage: streamsload produce|wait [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "seed brokers, comma-separated")
	in := fs.String("in", "streams-in", "input topic")
	out := fs.String("out", "streams-out", "output topic")
	keys := fs.Int("keys", 1000, "distinct keys")
	perKey := fs.Int("per-key", 1000, "records per key")
	parts := fs.Int("partitions", 6, "partitions of the input and output topics")
	timeout := fs.Duration("timeout", 15*time.Minute, "give up after this long")
	_ = fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	if mode == "produce" {
		err = produce(ctx, strings.Split(*brokers, ","), *in, *out, *keys, *perKey, int32(*parts))
	} else {
		err = wait(ctx, strings.Split(*brokers, ","), *out, *keys, int64(*perKey))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "streamsload:", err)
		os.Exit(1)
	}
}

func key(i int) string { return fmt.Sprintf("k%05d", i) }

func produce(ctx context.Context, seeds []string, in, out string, keys, perKey int, parts int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, t := range []string{in, out} {
		if _, err := adm.CreateTopic(ctx, parts, 1, nil, t); err != nil {
			return fmt.Errorf("cannot create topic %s: %w", t, err)
		}
	}
	errs := make(chan error, 1)
	for j := 0; j < perKey; j++ {
		for i := 0; i < keys; i++ {
			r := &kgo.Record{Topic: in, Key: []byte(key(i)), Value: []byte(strconv.Itoa(j))}
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			})
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errs:
		return fmt.Errorf("cannot produce to %s: %w", in, err)
	default:
	}
	fmt.Printf("produced %d records to %s\n", keys*perKey, in)
	return nil
}

func wait(ctx context.Context, seeds []string, out string, keys int, want int64) error {
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(out),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cl.Close()
	last := make(map[string]int64, keys)
	done, read := 0, 0
	for done < keys {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d keys at %d after %s", done, keys, want, time.Since(start).Round(time.Second))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Value) != 8 {
				return
			}
			read++
			v := int64(binary.BigEndian.Uint64(r.Value))
			k := string(r.Key)
			if last[k] != want && v == want {
				done++
			} else if last[k] == want && v != want {
				done--
			}
			last[k] = v
		})
	}
	secs := time.Since(start).Seconds()
	res := map[string]any{"keys": keys, "per_key": want, "seconds": secs, "output_records": read,
		"input_records_per_s": float64(int64(keys)*want) / secs}
	b, _ := json.Marshal(res)
	fmt.Printf("%d keys × %d counted in %.1f s\n%s\n", keys, want, secs, b)
	return nil
}
