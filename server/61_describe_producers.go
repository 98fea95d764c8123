package server

// DescribeProducers: v0 (KIP-664)
//
// Behavior:
//   - Per requested partition, answered by its leader: READ on the topic (else
//     TOPIC_AUTHORIZATION_FAILED, 29), UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER (6)
//     (the shared check of topology.go; a partition of an internal topic lists no producers),
//     else every producer the partition holds state for: id, epoch, last sequence, last timestamp,
//     the coordinator epoch of its last marker and the first offset of its ongoing transaction
//     (-1 if none) — what kafka-transactions.sh describe-producers / find-hanging read.
//   - Cluster mode, a broker that Metadata lists as a replica of the partition but that does not
//     lead it: Apache answers from any replica (its follower holds the replicated producer
//     state), and `kafka-transactions.sh find-hanging --broker-id N` asks broker N about every
//     partition N is a replica of, failing outright on NOT_LEADER_OR_FOLLOWER. A kaas follower
//     holds no state of its own (the leader owns the partition on the shared volume), so it
//     forwards those partitions to their leaders, one request per leader, and answers with what
//     each leader answered (6 if a leader cannot be reached or no longer leads). A broker that is
//     not a replica (an internal topic, RF 1) answers 6, as Apache does.
//   - The forwarded form carries the tagged field tagDescribeProducersForwarded: the leader
//     requires CLUSTER_ACTION of its caller instead of READ on each topic (the forwarding broker
//     authorized the client already) and never forwards it again.
//
// Version notes: v0 only, flexible.

import (
	"context"
	"sync"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

func init() { register(kmsg.DescribeProducers, 0, 0, handleDescribeProducers) }

// tagDescribeProducersForwarded marks a DescribeProducers a replica forwarded to the leader
// (value: one byte, 1). Apache defines no tagged field on DescribeProducers; the number is far from
// the low ones Apache hands out, next to tagTxnOffsetCommitVersion.
const tagDescribeProducersForwarded = 0x6b62

var (
	mDescribeProducersForwarded     = metrics.NewCounter(`kaas_describe_producers_forwarded_requests_total`)
	mDescribeProducersForwardFailed = metrics.NewCounter(`kaas_describe_producers_forward_failures_total`)
)

func handleDescribeProducers(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeProducersRequest)
	resp := req.ResponseKind().(*kmsg.DescribeProducersResponse)
	forwarded := false
	req.UnknownTags.Each(func(key uint32, _ []byte) { forwarded = forwarded || key == tagDescribeProducersForwarded })
	if forwarded && !rc.authorized(OpClusterAction, ResCluster, clusterResource) {
		for _, rt := range req.Topics {
			ot := kmsg.NewDescribeProducersResponseTopic()
			ot.Topic = rt.Topic
			for _, pn := range rt.Partitions {
				op := kmsg.NewDescribeProducersResponseTopicPartition()
				op.Partition, op.ErrorCode = pn, codec.CodeClusterAuthorizationFailed
				ot.Partitions = append(ot.Partitions, op)
			}
			resp.Topics = append(resp.Topics, ot)
		}
		return resp, nil
	}
	type fwd struct{ ti, pi int } // indexes into resp.Topics[ti].Partitions[pi]
	var remote map[int32][]fwd    // by leader
	for _, rt := range req.Topics {
		ot := kmsg.NewDescribeProducersResponseTopic()
		ot.Topic = rt.Topic
		op := OpRead
		if forwarded {
			op = opCallerAuthorized
		}
		tr := rc.lookupTopic(op, rt.Topic)
		for _, pn := range rt.Partitions {
			op := kmsg.NewDescribeProducersResponseTopicPartition()
			op.Partition = pn
			lp, code := rc.localPartition(&tr, pn, -1)
			switch {
			case code == codec.CodeNotLeaderForPartition && !forwarded:
				op.ErrorCode = code
				if leader, ok := rc.replicaOf(&tr, pn); ok {
					if remote == nil {
						remote = map[int32][]fwd{}
					}
					remote[leader] = append(remote[leader], fwd{len(resp.Topics), len(ot.Partitions)})
				}
			case code != codec.CodeNone:
				op.ErrorCode = code
			case lp.p == nil:
				// An internal topic's partition holds no producer state here (no log).
			default:
				for _, pi := range lp.p.Producers() {
					ap := kmsg.NewDescribeProducersResponseTopicPartitionActiveProducer()
					ap.ProducerID = pi.ProducerID
					ap.ProducerEpoch = int32(pi.Epoch)
					ap.LastSequence = pi.LastSequence
					ap.LastTimestamp = pi.LastTimestamp
					ap.CoordinatorEpoch = pi.CoordinatorEpoch
					ap.CurrentTxnStartOffset = pi.CurrentTxnStartOffset
					op.ActiveProducers = append(op.ActiveProducers, ap)
				}
			}
			ot.Partitions = append(ot.Partitions, op)
		}
		resp.Topics = append(resp.Topics, ot)
	}
	if len(remote) == 0 {
		return resp, nil
	}
	// resp is complete in shape now: each forward fills only its own partitions' entries.
	rc.deferReply()
	var wg sync.WaitGroup
	for leader, parts := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rc.guard()
			rc.s.forwardDescribeProducers(leader, func(yield func(p *kmsg.DescribeProducersResponseTopicPartition, topic string) bool) {
				for _, f := range parts {
					if !yield(&resp.Topics[f.ti].Partitions[f.pi], resp.Topics[f.ti].Topic) {
						return
					}
				}
			})
		}()
	}
	go func() {
		defer rc.guard()
		wg.Wait()
		rc.reply(resp)
	}()
	return nil, nil
}

// replicaOf reports the leader of a partition this broker does not lead, when Metadata lists
// this broker among its replicas (replicaList over the live brokers, the same computation).
func (rc *reqCtx) replicaOf(tr *topicRef, part int32) (int32, bool) {
	if tr.code != codec.CodeNone {
		return 0, false
	}
	s := rc.s
	topo := s.deps.Topology
	o := topology.PartitionOwner(topo, tr.name, part)
	if !o.Known || o.Local || o.Broker == topo.LocalID() {
		return 0, false
	}
	brokers := s.liveBrokers(rc.c.ln.name)
	if _, ok := findBroker(brokers, o.Broker); !ok {
		return 0, false
	}
	for _, id := range replicaList(o.Broker, s.topics().ReplicationFactor(tr.name), brokers) {
		if id == topo.LocalID() {
			return o.Broker, true
		}
	}
	return 0, false
}

// forwardDescribeProducers asks broker leader about the partitions parts yields (response
// entries already set to NOT_LEADER_OR_FOLLOWER) and copies its answer into them. A failure
// leaves them at 6: retriable for a client that lets the admin client find the leader.
func (s *Server) forwardDescribeProducers(leader int32, parts func(yield func(p *kmsg.DescribeProducersResponseTopicPartition, topic string) bool)) {
	mDescribeProducersForwarded.Inc()
	b, err := s.peers.Broker(leader)
	if err != nil {
		mDescribeProducersForwardFailed.Inc()
		return
	}
	req := kmsg.NewPtrDescribeProducersRequest()
	req.UnknownTags.Set(tagDescribeProducersForwarded, []byte{1})
	at := map[string]int{}
	for p, topic := range parts {
		i, ok := at[topic]
		if !ok {
			i = len(req.Topics)
			at[topic] = i
			rt := kmsg.NewDescribeProducersRequestTopic()
			rt.Topic = topic
			req.Topics = append(req.Topics, rt)
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, p.Partition)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerRequestTimeout)
	defer cancel()
	kresp, err := b.Request(ctx, req)
	if err != nil {
		mDescribeProducersForwardFailed.Inc()
		return
	}
	type key struct {
		topic string
		part  int32
	}
	got := map[key]*kmsg.DescribeProducersResponseTopicPartition{}
	for ti := range kresp.(*kmsg.DescribeProducersResponse).Topics {
		rt := &kresp.(*kmsg.DescribeProducersResponse).Topics[ti]
		for pi := range rt.Partitions {
			got[key{rt.Topic, rt.Partitions[pi].Partition}] = &rt.Partitions[pi]
		}
	}
	for p, topic := range parts {
		if g, ok := got[key{topic, p.Partition}]; ok {
			p.ErrorCode, p.ErrorMessage, p.ActiveProducers = g.ErrorCode, g.ErrorMessage, g.ActiveProducers
		}
	}
}
