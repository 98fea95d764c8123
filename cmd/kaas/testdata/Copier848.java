// A consume-transform-produce member for the KIP-848 end-to-end test (e2e_848_test.go). None of
// the tools shipped in Kafka 4.1.1 runs a transactional copy loop under group.protocol=consumer
// (TransactionalMessageCopier builds its own consumer properties and takes none from the command
// line), so the test runs this file with the JDK's source launcher against the Kafka jars.
//
// It does what a Kafka 4.x exactly-once application does: subscribe with the new consumer group
// protocol, read_committed, and for every poll one transaction holding the transformed records
// plus the consumed offsets committed through sendOffsetsToTransaction with the consumer's group
// metadata (KIP-447: the coordinator fences a zombie by member epoch). SIGTERM makes it leave the
// group cleanly (consumer.close → heartbeat with member epoch -1).
//
// Usage: java -cp <kafka jars> Copier848.java <bootstrap> <in> <out> <group> <member> <pauseMs>
// Prints one JSON object per line: {"event":"assigned"|"revoked","partitions":[...]},
// {"event":"committed","records":n,"total":N}, {"event":"aborted","error":"..."}, {"event":"closed"}.

import java.time.Duration;
import java.util.*;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Copier848 {
    static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String parts(Collection<TopicPartition> tps) {
        StringBuilder sb = new StringBuilder("[");
        for (TopicPartition tp : tps) {
            if (sb.length() > 1) sb.append(',');
            sb.append(tp.partition());
        }
        return sb.append(']').toString();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], in = args[1], out = args[2], group = args[3], member = args[4];
        long pauseMs = Long.parseLong(args[5]);
        // group.protocol: consumer (KIP-848) unless a 7th argument says classic (rolling upgrades).
        String protocol = args.length > 6 ? args[6] : "consumer";

        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        cp.put(ConsumerConfig.CLIENT_ID_CONFIG, member);
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "copier848-" + member + "-" + group);
        pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "10000");
        pp.put(ProducerConfig.CLIENT_ID_CONFIG, member + "-producer");
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp);
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp);
        producer.initTransactions();

        AtomicBoolean running = new AtomicBoolean(true);
        Thread mainThread = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running.set(false);
            consumer.wakeup();
            try {
                mainThread.join(30000);
            } catch (InterruptedException ignored) {
            }
        }));

        consumer.subscribe(List.of(in), new ConsumerRebalanceListener() {
            public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                emit("{\"event\":\"revoked\",\"partitions\":" + parts(tps) + "}");
            }

            public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                emit("{\"event\":\"assigned\",\"partitions\":" + parts(consumer.assignment()) + "}");
            }
        });

        long total = 0;
        try {
            while (running.get()) {
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(200));
                if (recs.isEmpty()) continue;
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                try {
                    producer.beginTransaction();
                    for (ConsumerRecord<byte[], byte[]> r : recs) {
                        // The transform: the value is copied, the key records where it came from.
                        byte[] key = (r.partition() + "/" + r.offset()).getBytes();
                        producer.send(new ProducerRecord<>(out, key, r.value()));
                        offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                    producer.commitTransaction();
                    total += recs.count();
                    emit("{\"event\":\"committed\",\"records\":" + recs.count() + ",\"total\":" + total + "}");
                } catch (KafkaException e) {
                    // A rebalance fenced this generation (CommitFailedException, FENCED_MEMBER_EPOCH
                    // …) or the transaction failed: abort and restart from the committed offsets.
                    emit("{\"event\":\"aborted\",\"error\":\"" + e.getClass().getSimpleName() + "\"}");
                    producer.abortTransaction();
                    Set<TopicPartition> owned = consumer.assignment();
                    Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(owned);
                    for (TopicPartition tp : owned) {
                        OffsetAndMetadata o = committed.get(tp);
                        if (o != null) consumer.seek(tp, o.offset());
                        else consumer.seekToBeginning(List.of(tp));
                    }
                }
                if (pauseMs > 0) Thread.sleep(pauseMs);
            }
        } catch (WakeupException e) {
            // SIGTERM: fall through to a clean leave.
        } finally {
            producer.close();
            consumer.close();
            emit("{\"event\":\"closed\"}");
        }
    }
}
