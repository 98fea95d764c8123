// A Kafka Streams exactly-once application for kaas's end-to-end tests (cmd/kaas/e2e_streams_test.go):
// input (String keys) → groupByKey().count() in a persistent RocksDB store → output (Long counts).
//
//   java -cp target/classes:target/lib/* StreamsCount <bootstrap> <application.id> <input> <output> <state.dir> [key=value...]
//
// Extra key=value arguments are StreamsConfig properties (e.g. topic.segment.ms=200, which Streams
// applies to the changelog topic it creates), except kaas.repartition=true, which re-keys the
// stream before counting: Streams then routes it through a repartition topic it creates
// (<application.id>-counts-repartition) and purges that topic with DeleteRecords after commits. The process runs until SIGTERM, then closes the
// Streams instance cleanly (committing its open transaction). Each state change is printed on
// stdout as "STATE <old> <new>" so that the test can see RUNNING and a fatal ERROR.
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class StreamsCount {
    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: StreamsCount <bootstrap> <application.id> <input> <output> <state.dir> [key=value...]");
            System.exit(2);
        }
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        p.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        // No record cache: every input record updates the store, its changelog and the output,
        // so the committed output of a key is exactly 1, 2, ..., n and the changelog has one
        // record per input record (what makes its compaction visible). bench/perf-streams.sh
        // passes statestore.cache.max.bytes as an argument to measure with Streams' default.
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // A broker killed with -9 comes back within seconds: keep retrying instead of failing
        // the task (task.timeout.ms) or the producer (delivery.timeout.ms) early.
        p.put(StreamsConfig.TASK_TIMEOUT_MS_CONFIG, 120_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG), 120_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.MAX_BLOCK_MS_CONFIG), 60_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10_000);
        p.put(StreamsConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, 500);
        p.put(StreamsConfig.RETRY_BACKOFF_MS_CONFIG, 100);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // A closed Streams instance does not leave its group (dynamic members: a restarted
        // instance is expected back within the session timeout). The tests restart the app as a
        // new process with new member ids, whose join waits for the old members' sessions to
        // expire: keep that short (group.min.session.timeout.ms is 6 s).
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6_000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1_500);
        for (int i = 5; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                System.err.println("not key=value: " + args[i]);
                System.exit(2);
            }
            p.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        boolean repartition = "true".equals(p.remove("kaas.repartition"));

        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()));
        if (repartition) {
            // The same key again, but Streams cannot know it: the count must repartition.
            in = in.selectKey((k, v) -> k);
        }
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
            .toStream()
            .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, old) -> {
            System.out.println("STATE " + old + " " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                done.countDown();
            }
        });
        // A stream thread that died on an exception the clients did not retry (e.g. a fenced
        // producer after the broker came back) is replaced, as production EOS apps do; the new
        // thread aborts what the old one left open and resumes from the committed offsets.
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("stream thread died, replacing it: " + e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            done.countDown();
        }));
        streams.start();
        done.await();
        streams.close(Duration.ofSeconds(30));
    }
}
