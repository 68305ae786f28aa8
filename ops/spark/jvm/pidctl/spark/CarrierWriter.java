package pidctl.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32C;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.message.ProduceRequestData;
import org.apache.kafka.common.message.ProduceResponseData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.record.CompressionType;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.MemoryRecordsBuilder;
import org.apache.kafka.common.record.Record;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.requests.ProduceRequest;
import org.apache.kafka.common.requests.ProduceResponse;
import org.apache.kafka.common.utils.Utils;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;

/**
 * One Spark task's rows into Kafka with the task's preallocated PID, each row with the same
 * (PID, epoch, sequence) on every attempt: the JVM's twin of ops/spark/kafka_producer.py,
 * which documents the protocol (sequences per Kafka partition from 0 in the order of the rows;
 * batches stamped with the fingerprint of the producer's rows; an attempt that may follow
 * another asks LastSequence on its question connection, skips what was written, and checks
 * its rows against the stamp before it sends anything; a failed batch resolved from
 * LastSequence, retries bounded by the delivery timeout). The two write the same bytes.
 */
final class CarrierWriter implements DataWriter<InternalRow> {
  /** The sink cannot write: the message names the option, topic or partition, and why. */
  static class WriteError extends IOException {
    WriteError(String message) {
      super(message);
    }
  }

  /** This attempt's rows are not the ones its PID already wrote: nothing of them is sent. */
  static final class RowsDiffer extends WriteError {
    RowsDiffer(String message) {
      super(message);
    }
  }

  static final int MAX_IN_FLIGHT = 5;
  static final int STICKY_ROWS = 1000;
  static final int RECORD_OVERHEAD = 12, STAMP_ROOM = 96, BATCH_HEADER = 61;
  static final long BUFFER_BYTES = 32L << 20, HOLD_LIMIT_BYTES = 64L << 20;
  static final String STAMP_HEADER = "pidctl.fp";
  static final int SEQUENCE_LIMIT = Integer.MAX_VALUE;

  static final class Row {
    final byte[] key, value;
    final Header[] headers;
    final int size;

    Row(byte[] key, byte[] value, Header[] headers, int size) {
      this.key = key;
      this.value = value;
      this.headers = headers;
      this.size = size;
    }
  }

  static final class Batch {
    final String topic;
    final int partition;
    final int first;
    final List<Row> rows;
    final long fingerprintBefore, fingerprintAfter;

    Batch(String topic, int partition, int first, List<Row> rows, long before, long after) {
      this.topic = topic;
      this.partition = partition;
      this.first = first;
      this.rows = rows;
      this.fingerprintBefore = before;
      this.fingerprintAfter = after;
    }

    int last() {
      return first + rows.size() - 1;
    }

    long fingerprintAt(int sequence) {
      long value = fingerprintBefore;
      for (int i = 0; i <= sequence - first; i++) {
        value = Crc32c.update(value, canonical(rows.get(i)));
      }
      return value;
    }
  }

  static final class State {
    int nextSequence;
    long writtenThrough = -1;
    final CRC32C fingerprint = new CRC32C();
    long expectedSequence = -1, expectedFingerprint;
    boolean expectedInitial;
    List<Row> open = new ArrayList<>();
    int openBytes, openFirst;
    long openFingerprint, lastFingerprint;
    int inFlight;
    final List<Batch> failed = new ArrayList<>();
    long failingSince = -1;
    long attempts;
    long sent, skipped;
  }

  private final KafkaCarrier.Plan plan;
  private final int sparkPartition;
  private final long producerId;
  private final short epoch;
  private final boolean resume;
  private long startedMs;
  private final Wire wire;
  private final int keyIndex, valueIndex, topicIndex, partitionIndex, headersIndex;
  private final boolean keyString, valueString;
  private final Map<String, State[]> states = new HashMap<>();
  private final Map<String, Integer> pinned = new HashMap<>();
  private final Map<String, Integer> sticky = new HashMap<>();
  private final Map<Integer, ArrayDeque<Batch>> inFlight = new HashMap<>();
  private final List<Batch> held = new ArrayList<>();
  private long heldBytes, openBytes;
  private int pendingChecks;
  private final Compression compression;

  CarrierWriter(KafkaCarrier.Plan plan, StructType schema, int sparkPartition) {
    this.plan = plan;
    this.sparkPartition = sparkPartition;
    this.producerId = plan.producerId(sparkPartition);
    this.epoch = plan.epoch;
    TaskContext context = TaskContext.get();
    int attempt = context == null ? 0 : context.attemptNumber();
    this.resume = attempt > 0 || plan.expected.containsKey(sparkPartition);
    this.startedMs = plan.startedMs;
    this.wire = new Wire(plan.bootstrap, plan.clientId, plan.requestTimeoutMs + 30_000);
    this.pinned.putAll(plan.partitions);
    List<String> names = new ArrayList<>();
    for (String name : schema.fieldNames()) {
      names.add(name.toLowerCase());
    }
    keyIndex = names.indexOf("key");
    valueIndex = names.indexOf("value");
    topicIndex = names.indexOf("topic");
    partitionIndex = names.indexOf("partition");
    headersIndex = names.indexOf("headers");
    keyString = keyIndex >= 0 && schema.fields()[keyIndex].dataType() instanceof StringType;
    valueString = schema.fields()[valueIndex].dataType() instanceof StringType;
    compression = plan.compression == 0
        ? Compression.NONE
        : Compression.of(CompressionType.forId(plan.compression)).build();
  }

  // -- rows in -------------------------------------------------------------------------------

  private static byte[] bytes(InternalRow row, int index, boolean string) {
    if (index < 0 || row.isNullAt(index)) {
      return null;
    }
    return string ? row.getUTF8String(index).getBytes() : row.getBinary(index);
  }

  private Header[] headers(InternalRow row) {
    if (headersIndex < 0 || row.isNullAt(headersIndex)) {
      return Record.EMPTY_HEADERS;
    }
    ArrayData array = row.getArray(headersIndex);
    Header[] out = new Header[array.numElements()];
    for (int i = 0; i < out.length; i++) {
      InternalRow h = array.getStruct(i, 2);
      String key = h.isNullAt(0) ? "" : h.getUTF8String(0).toString();
      out[i] = new RecordHeader(key, h.isNullAt(1) ? null : h.getBinary(1));
    }
    return out;
  }

  /** A row's canonical bytes: key length, key, value length, value, headers (what the
   * fingerprint covers; ops/spark/kafka_records.py). */
  static byte[] canonical(Row row) {
    ByteArrayOutputStream out = new ByteArrayOutputStream(row.size + 16);
    lengthAndBytes(out, row.key);
    lengthAndBytes(out, row.value);
    varint(out, row.headers.length);
    for (Header h : row.headers) {
      lengthAndBytes(out, h.key().getBytes(StandardCharsets.UTF_8));
      lengthAndBytes(out, h.value());
    }
    return out.toByteArray();
  }

  private static void lengthAndBytes(ByteArrayOutputStream out, byte[] data) {
    if (data == null) {
      varint(out, -1);
    } else {
      varint(out, data.length);
      out.write(data, 0, data.length);
    }
  }

  private static void varint(ByteArrayOutputStream out, long value) {
    long zz = (value << 1) ^ (value >> 63);
    while ((zz & ~0x7FL) != 0) {
      out.write((int) ((zz & 0x7F) | 0x80));
      zz >>>= 7;
    }
    out.write((int) zz);
  }

  private int partitionCount(String topic) throws IOException {
    // A task's first Metadata waits out an unreachable cluster within the delivery timeout,
    // as its later questions do (no lambda per row: the layout is known after the first).
    int[] known = wire.leaders.get(topic);
    int now = (known != null ? known : retrying(() -> wire.layout(topic))).length;
    Integer held = pinned.putIfAbsent(topic, now);
    if (held != null && held != now) {
      throw new RowsDiffer("topic '" + topic + "' has " + now + " partitions, not the " + held
          + " it had when the job started: keyed rows would go to other partitions than the job's"
          + " first rows did");
    }
    return held == null ? now : held;
  }

  @Override
  public void write(InternalRow row) throws IOException {
    String topic = plan.topic;
    if (topic == null) {
      if (row.isNullAt(topicIndex)) {
        throw new WriteError("a row's 'topic' is null and no topic option is set");
      }
      topic = row.getUTF8String(topicIndex).toString();
    }
    byte[] key = bytes(row, keyIndex, keyString);
    byte[] value = bytes(row, valueIndex, valueString);
    Header[] headers = headers(row);
    int partitions = partitionCount(topic);
    int partition;
    if (partitionIndex >= 0 && !row.isNullAt(partitionIndex)) {
      partition = row.getInt(partitionIndex);
      if (partition < 0 || partition >= partitions) {
        throw new WriteError("partition " + partition + " of topic '" + topic + "' is out of "
            + "range: the topic has " + partitions + " partitions (column 'partition')");
      }
    } else if (key != null) {
      partition = Utils.toPositive(Utils.murmur2(key)) % partitions;
    } else {
      int seen = sticky.merge(topic, 1, Integer::sum) - 1;
      partition = (sparkPartition + seen / STICKY_ROWS) % partitions;
    }
    int size = (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
    for (Header h : headers) {
      size += h.key().length() + (h.value() == null ? 0 : h.value().length) + 4;
    }
    add(topic, partition, new Row(key, value, headers, size + 12));
  }

  private State state(String topic, int partition) throws IOException {
    State[] all = states.get(topic);
    if (all == null) {
      int count = partitionCount(topic);
      all = new State[count];
      for (int p = 0; p < count; p++) {
        all[p] = new State();
      }
      states.put(topic, all);
      if (resume) {
        describe(topic, all);
      }
    }
    return all[partition];
  }

  private void add(String topic, int partition, Row row) throws IOException {
    State state = state(topic, partition);
    int sequence = state.nextSequence;
    if (sequence >= SEQUENCE_LIMIT) {
      throw new WriteError(topic + "-" + partition + ": more than " + SEQUENCE_LIMIT
          + " rows from one Spark partition");
    }
    long before = state.fingerprint.getValue();
    state.fingerprint.update(canonical(row));
    long after = state.fingerprint.getValue();
    state.nextSequence = sequence + 1;
    if (state.expectedSequence == sequence) {
      check(topic, partition, state, after);
    }
    if (sequence <= state.writtenThrough) {
      if (!state.open.isEmpty()) {
        ship(topic, partition, state);
      }
      state.skipped++;
      return;
    }
    int room = plan.batchBytes - BATCH_HEADER - STAMP_ROOM;
    if (!state.open.isEmpty() && state.openBytes + row.size + RECORD_OVERHEAD > room) {
      ship(topic, partition, state);
    }
    if (state.open.isEmpty()) {
      state.openFirst = sequence;
      state.openFingerprint = before;
    }
    state.open.add(row);
    state.openBytes += row.size + RECORD_OVERHEAD;
    state.lastFingerprint = after;
    openBytes += row.size + RECORD_OVERHEAD;
    if (openBytes > BUFFER_BYTES) {
      for (Map.Entry<String, State[]> e : states.entrySet()) {
        for (int p = 0; p < e.getValue().length; p++) {
          if (!e.getValue()[p].open.isEmpty()) {
            ship(e.getKey(), p, e.getValue()[p]);
          }
        }
      }
    }
  }

  // -- what earlier attempts wrote ------------------------------------------------------------

  private <T> T retrying(Wire.Call<T> ask) throws IOException {
    long since = System.currentTimeMillis();
    long attempts = 0;
    while (true) {
      try {
        return ask.call();
      } catch (Wire.Unavailable e) {
        attempts++;
        if (System.currentTimeMillis() - since > plan.deliveryTimeoutMs) {
          throw new WriteError("gave up after " + attempts + " tries in "
              + plan.deliveryTimeoutMs / 1000 + " s (kafka.delivery.timeout.ms): " + e.getMessage());
        }
        sleep(backoff(attempts));
        for (String topic : states.keySet()) {
          try {
            wire.refresh(topic);
          } catch (Wire.Unavailable ignored) {
            // asked again on the next round
          }
        }
      }
    }
  }

  private void describe(String topic, State[] all) throws IOException {
    int count = all.length;
    Map<Integer, long[]> found = retrying(() -> wire.describeProducer(topic, count, producerId));
    for (Map.Entry<Integer, long[]> e : found.entrySet()) {
      int partition = e.getKey();
      long[] mine = e.getValue();
      collision(topic, partition, mine);
      State state = all[partition];
      if (mine[0] <= state.writtenThrough) {
        continue;
      }
      Stamp stamp = stampOf(topic, partition, mine);
      if (stamp.partitions != count) {
        throw new RowsDiffer(topic + "-" + partition + ": producer " + producerId
            + " wrote its rows when topic '" + topic + "' had " + stamp.partitions
            + " partitions; it has " + count + " now, so keyed rows would go to other"
            + " partitions: run it as a new version");
      }
      state.writtenThrough = mine[0];
      state.expectedSequence = mine[0];
      state.expectedFingerprint = stamp.fingerprint;
      state.expectedInitial = true;
      pendingChecks++;
    }
  }

  private void collision(String topic, int partition, long[] mine) throws WriteError {
    if (mine[2] != epoch || mine[3] != 0) {
      throw new WriteError(topic + "-" + partition + ": producer id " + producerId
          + " is in use by another producer (epoch " + mine[2]
          + (mine[3] != 0 ? ", in a transaction" : "")
          + "): the job's PID range collides with the cluster's (docs/spark-kafka.md)");
    }
  }

  static final class Stamp {
    final int partitions;
    final long fingerprint, startedMs;

    Stamp(int partitions, long fingerprint, long startedMs) {
      this.partitions = partitions;
      this.fingerprint = fingerprint;
      this.startedMs = startedMs;
    }

    static Stamp read(byte[] value) {
      if (value == null) {
        return null;
      }
      String[] parts = new String(value, StandardCharsets.UTF_8).split(" ", 6);
      if (parts.length != 6 || !parts[0].equals("v1")) {
        return null;
      }
      try {
        return new Stamp(Integer.parseInt(parts[1]), Long.parseLong(parts[2]), Long.parseLong(parts[3]));
      } catch (NumberFormatException e) {
        return null;
      }
    }
  }

  private Stamp stampOf(String topic, int partition, long[] mine) throws IOException {
    RecordBatch found = retrying(() -> wire.findBatch(topic, partition, producerId, mine[0], mine[1]));
    Stamp stamp = null;
    if (found != null) {
      Record first = found.iterator().next();
      for (Header h : first.headers()) {
        if (h.key().equals(STAMP_HEADER)) {
          stamp = Stamp.read(h.value());
          break;
        }
      }
    }
    if (stamp == null) {
      throw new WriteError(topic + "-" + partition + ": cannot read what producer " + producerId
          + " wrote through sequence " + mine[0] + " (its last batch is gone, or was not written"
          + " by this version of pidctl-kafka), so this attempt cannot check its rows are the"
          + " same: run it as a new version");
    }
    startedMs = Math.min(startedMs, stamp.startedMs);
    long age = System.currentTimeMillis() - stamp.startedMs;
    if (age >= plan.expirationMs) {
      throw new WriteError(topic + "-" + partition + ": producer " + producerId + "'s rows were"
          + " written by a run that started " + age + " ms ago, at least the brokers'"
          + " producer.id.expiration.ms (" + plan.expirationMs + "): they may have forgotten"
          + " some, and this attempt would write them again; run it as a new version");
    }
    return stamp;
  }

  private void check(String topic, int partition, State state, long fingerprint) throws IOException {
    if (fingerprint != state.expectedFingerprint) {
      throw new RowsDiffer(topic + "-" + partition + ": this attempt's first "
          + (state.expectedSequence + 1) + " rows are not the ones producer " + producerId
          + " already wrote (another data set, a non-deterministic input, or another"
          + " partitioning): nothing of them is sent; run it as a new version");
    }
    boolean initial = state.expectedInitial;
    state.expectedSequence = -1;
    if (initial && --pendingChecks == 0) {
      List<Batch> waiting = new ArrayList<>(held);
      held.clear();
      heldBytes = 0;
      for (Batch b : waiting) {
        send(b);
      }
    }
  }

  // -- batches out ----------------------------------------------------------------------------

  private void ship(String topic, int partition, State state) throws IOException {
    Batch batch = new Batch(topic, partition, state.openFirst, state.open, state.openFingerprint,
        state.lastFingerprint);
    openBytes -= state.openBytes;
    state.open = new ArrayList<>();
    state.openBytes = 0;
    if (pendingChecks > 0) {
      held.add(batch);
      heldBytes += batch.rows.size() * 16L;
      for (Row r : batch.rows) {
        heldBytes += r.size;
      }
      if (heldBytes > HOLD_LIMIT_BYTES) {
        differsUnchecked();
      }
      return;
    }
    if (!state.failed.isEmpty()) {
      settle(topic, partition, state);
    }
    send(batch);
  }

  private void differsUnchecked() throws RowsDiffer {
    List<String> pending = new ArrayList<>();
    for (Map.Entry<String, State[]> e : states.entrySet()) {
      for (int p = 0; p < e.getValue().length; p++) {
        State s = e.getValue()[p];
        if (s.expectedSequence >= 0 && s.expectedInitial) {
          pending.add(e.getKey() + "-" + p + " (sequence " + s.expectedSequence + ")");
        }
      }
    }
    throw new RowsDiffer("producer " + producerId + " already wrote rows this attempt does not"
        + " reach: " + String.join(", ", pending) + ": its rows are not the ones written (another"
        + " data set, a non-deterministic input, or another partitioning); nothing of them is"
        + " sent; run it as a new version");
  }

  private MemoryRecords encode(Batch batch, int first) throws IOException {
    int count = batch.last() - first + 1;
    long timestamp = System.currentTimeMillis();
    int capacity = BATCH_HEADER + STAMP_ROOM + plan.appId.length() * 2;
    for (int i = first - batch.first; i <= batch.last() - batch.first; i++) {
      capacity += batch.rows.get(i).size + RECORD_OVERHEAD + 8;
    }
    MemoryRecordsBuilder builder = MemoryRecords.builder(ByteBuffer.allocate(capacity),
        RecordBatch.CURRENT_MAGIC_VALUE, compression, TimestampType.CREATE_TIME, 0L, timestamp,
        producerId, epoch, first, false, false, RecordBatch.NO_PARTITION_LEADER_EPOCH);
    String value = "v1 " + partitionCount(batch.topic) + " " + batch.fingerprintAfter + " "
        + startedMs + " " + plan.version + " " + plan.appId;
    for (int i = 0; i < count; i++) {
      Row row = batch.rows.get(first - batch.first + i);
      Header[] headers = row.headers;
      if (i == 0) {
        headers = java.util.Arrays.copyOf(headers, headers.length + 1);
        headers[headers.length - 1] =
            new RecordHeader(STAMP_HEADER, value.getBytes(StandardCharsets.UTF_8));
      }
      builder.append(timestamp, row.key, row.value, headers);
    }
    return builder.build();
  }

  private void send(Batch batch) throws IOException {
    State state = states.get(batch.topic)[batch.partition];
    // A leader takes a PID it has not seen at any sequence (it checks sequences from a
    // producer's first batch on), so a batch landing while an earlier one waits for a leader
    // would leave a gap that LastSequence cannot show: until one batch of the partition is
    // answered, the earlier ones are settled before another is sent.
    while (state.writtenThrough < 0 && (state.inFlight > 0 || !state.failed.isEmpty())) {
      settle(batch.topic, batch.partition, state);
    }
    int first = (int) Math.max(batch.first, state.writtenThrough + 1);
    if (first > batch.last()) {
      state.skipped += batch.rows.size();
      return;
    }
    if (first > batch.first) {
      state.skipped += first - batch.first;
      batch = new Batch(batch.topic, batch.partition, first,
          batch.rows.subList(first - batch.first, batch.rows.size()),
          batch.fingerprintAt(first - 1), batch.fingerprintAfter);
    }
    int leader = wire.leader(batch.topic, batch.partition);
    if (leader < 0) {
      failed(batch, Errors.LEADER_NOT_AVAILABLE, null);
      return;
    }
    ArrayDeque<Batch> queue = inFlight.computeIfAbsent(leader, k -> new ArrayDeque<>());
    while (queue.size() >= MAX_IN_FLIGHT) {
      receive(leader);
      queue = inFlight.computeIfAbsent(leader, k -> new ArrayDeque<>());
    }
    ProduceRequestData data = new ProduceRequestData()
        .setAcks((short) -1)
        .setTimeoutMs(plan.requestTimeoutMs);
    ProduceRequestData.TopicProduceDataCollection topics =
        new ProduceRequestData.TopicProduceDataCollection();
    topics.add(new ProduceRequestData.TopicProduceData().setName(batch.topic).setPartitionData(
        List.of(new ProduceRequestData.PartitionProduceData()
            .setIndex(batch.partition)
            .setRecords(encode(batch, batch.first)))));
    data.setTopicData(topics);
    try {
      wire.producer(leader).send(
          new ProduceRequest.Builder(Wire.PRODUCE, Wire.PRODUCE, data).build(Wire.PRODUCE));
    } catch (IOException e) {
      if (e instanceof WriteError) {
        throw e;
      }
      connectionLost(leader);
      failed(batch, Errors.NETWORK_EXCEPTION, null);
      return;
    }
    inFlight.computeIfAbsent(leader, k -> new ArrayDeque<>()).add(batch);
    state.inFlight++;
  }

  private void receive(int leader) throws IOException {
    ArrayDeque<Batch> queue = inFlight.get(leader);
    ProduceResponse response;
    try {
      response = (ProduceResponse) wire.producer(leader).receive(ApiKeys.PRODUCE, Wire.PRODUCE);
    } catch (IOException e) {
      if (e instanceof WriteError) {
        throw e;
      }
      connectionLost(leader);
      return;
    }
    Batch batch = queue.poll();
    State state = states.get(batch.topic)[batch.partition];
    state.inFlight--;
    ProduceResponseData.PartitionProduceResponse answer =
        response.data().responses().iterator().next().partitionResponses().get(0);
    Errors error = Errors.forCode(answer.errorCode());
    if (error != Errors.NONE) {
      failed(batch, error, answer.errorMessage());
      return;
    }
    state.sent += batch.rows.size();
    state.writtenThrough = Math.max(state.writtenThrough, batch.last());
    state.failingSince = -1;
    state.attempts = 0;
  }

  private void connectionLost(int leader) throws IOException {
    wire.drop(leader);
    ArrayDeque<Batch> queue = inFlight.remove(leader);
    while (queue != null && !queue.isEmpty()) {
      Batch lost = queue.poll();
      states.get(lost.topic)[lost.partition].inFlight--;
      failed(lost, Errors.NETWORK_EXCEPTION, null);
    }
  }

  private static boolean retriable(Errors error) {
    switch (error) {
      case OUT_OF_ORDER_SEQUENCE_NUMBER:
      case NOT_LEADER_OR_FOLLOWER:
      case LEADER_NOT_AVAILABLE:
      case REQUEST_TIMED_OUT:
      case NOT_ENOUGH_REPLICAS:
      case NOT_ENOUGH_REPLICAS_AFTER_APPEND:
      case NETWORK_EXCEPTION:
      case KAFKA_STORAGE_ERROR:
      case UNKNOWN_TOPIC_OR_PARTITION:
      case FENCED_LEADER_EPOCH:
      case UNKNOWN_LEADER_EPOCH:
      case COORDINATOR_LOAD_IN_PROGRESS:
      case THROTTLING_QUOTA_EXCEEDED:
      case CORRUPT_MESSAGE:
        return true;
      default:
        return false;
    }
  }

  private void failed(Batch batch, Errors error, String message) throws WriteError {
    if (!retriable(error)) {
      throw new WriteError(batch.topic + "-" + batch.partition + ": Kafka refused a batch of"
          + " producer " + producerId + ": " + error.name()
          + (message == null ? "" : " (" + message + ")"));
    }
    State state = states.get(batch.topic)[batch.partition];
    state.failed.add(batch);
    if (state.failingSince < 0) {
      state.failingSince = System.currentTimeMillis();
    }
  }

  private void settle(String topic, int partition, State state) throws IOException {
    while (state.inFlight > 0) {
      int leader = -1;
      for (Map.Entry<Integer, ArrayDeque<Batch>> e : inFlight.entrySet()) {
        for (Batch b : e.getValue()) {
          if (b.topic.equals(topic) && b.partition == partition) {
            leader = e.getKey();
          }
        }
      }
      receive(leader);
    }
    while (!state.failed.isEmpty() && state.inFlight == 0) {
      resolve(topic, partition, state);
    }
  }

  private long backoff(long attempts) {
    double pause = plan.retryBackoffMs * Math.pow(2, Math.max(attempts - 1, 0));
    return (long) Math.min(plan.retryBackoffMaxMs, pause);
  }

  private static void sleep(long ms) throws IOException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new WriteError("interrupted");
    }
  }

  private void resolve(String topic, int partition, State state) throws IOException {
    state.attempts++;
    long failing = System.currentTimeMillis() - (state.failingSince < 0 ? System.currentTimeMillis() : state.failingSince);
    if (failing > plan.deliveryTimeoutMs || state.attempts > plan.retries) {
      throw new WriteError(topic + "-" + partition + ": gave up after " + failing / 1000.0
          + " s and " + state.attempts + " retries (kafka.delivery.timeout.ms "
          + plan.deliveryTimeoutMs + ", kafka.retries " + plan.retries + "; producer "
          + producerId + "): the batch could not be written");
    }
    sleep(backoff(state.attempts));
    try {
      wire.refresh(topic);
      Map<Integer, long[]> found = wire.describeProducer(topic, partitionCount(topic), producerId);
      long[] mine = found.get(partition);
      if (mine != null) {
        collision(topic, partition, mine);
        if (mine[0] > state.writtenThrough) {
          learn(topic, partition, state, mine);
        }
      }
    } catch (Wire.Unavailable e) {
      return; // asked again on the next round, until the delivery timeout
    }
    List<Batch> failed = new ArrayList<>(state.failed);
    state.failed.clear();
    failed.sort(Comparator.comparingInt(b -> b.first));
    for (Batch b : failed) {
      send(b);
    }
  }

  private void learn(String topic, int partition, State state, long[] mine) throws IOException {
    long last = mine[0];
    boolean own = false;
    for (Batch b : state.failed) {
      own |= b.last() == last;
    }
    if (own) {
      for (Batch b : new ArrayList<>(state.failed)) {
        if (b.last() <= last) {
          long first = Math.max(b.first, state.writtenThrough + 1);
          state.sent += Math.max(b.last() - first + 1, 0);
          state.failed.remove(b);
        }
      }
    } else {
      Stamp stamp = stampOf(topic, partition, mine);
      Long mineSoFar = fingerprintAt(state, last);
      state.expectedFingerprint = stamp.fingerprint;
      state.expectedInitial = false;
      if (mineSoFar == null) {
        state.expectedSequence = last;
      } else if (mineSoFar != stamp.fingerprint) {
        state.expectedSequence = last;
        check(topic, partition, state, mineSoFar);
      }
    }
    state.writtenThrough = last;
  }

  private Long fingerprintAt(State state, long sequence) {
    if (sequence >= state.nextSequence) {
      return null;
    }
    for (Batch b : state.failed) {
      if (b.first <= sequence && sequence <= b.last()) {
        return b.fingerprintAt((int) sequence);
      }
    }
    if (!state.open.isEmpty() && state.openFirst <= sequence) {
      long value = state.openFingerprint;
      for (int i = 0; i <= sequence - state.openFirst; i++) {
        value = Crc32c.update(value, canonical(state.open.get(i)));
      }
      return value;
    }
    return null;
  }

  // -- the end --------------------------------------------------------------------------------

  @Override
  public WriterCommitMessage commit() throws IOException {
    for (Map.Entry<String, State[]> e : states.entrySet()) {
      for (int p = 0; p < e.getValue().length; p++) {
        if (!e.getValue()[p].open.isEmpty()) {
          ship(e.getKey(), p, e.getValue()[p]);
        }
      }
    }
    if (pendingChecks > 0) {
      differsUnchecked();
    }
    while (true) {
      for (Integer leader : new ArrayList<>(inFlight.keySet())) {
        while (inFlight.containsKey(leader) && !inFlight.get(leader).isEmpty()) {
          receive(leader);
        }
      }
      boolean pending = false;
      for (Map.Entry<String, State[]> e : states.entrySet()) {
        for (int p = 0; p < e.getValue().length; p++) {
          if (!e.getValue()[p].failed.isEmpty()) {
            pending = true;
            settle(e.getKey(), p, e.getValue()[p]);
          }
        }
      }
      boolean flying = false;
      for (ArrayDeque<Batch> q : inFlight.values()) {
        flying |= !q.isEmpty();
      }
      if (!pending && !flying) {
        break;
      }
    }
    List<String> reports = new ArrayList<>();
    List<String> unreached = new ArrayList<>();
    for (Map.Entry<String, State[]> e : new java.util.TreeMap<>(states).entrySet()) {
      for (int p = 0; p < e.getValue().length; p++) {
        State s = e.getValue()[p];
        if (s.expectedSequence >= 0) {
          unreached.add(e.getKey() + "-" + p);
        }
        if (s.nextSequence == 0) {
          continue;
        }
        reports.add(String.format("{\"topic\":%s,\"partition\":%d,\"rows\":%d,\"written\":%d,"
            + "\"skipped\":%d,\"last_sequence\":%d}", quote(e.getKey()), p, s.nextSequence,
            s.sent, s.skipped, s.nextSequence - 1));
      }
    }
    if (!unreached.isEmpty()) {
      throw new RowsDiffer("another attempt of producer " + producerId + " wrote more rows to "
          + String.join(", ", unreached) + " than this one has: the attempts' rows differ");
    }
    return new KafkaCarrier.Report(reports);
  }

  private static String quote(String text) {
    return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }

  @Override
  public void abort() {}

  @Override
  public void close() {
    wire.close();
  }

  /** CRC-32C going on from a previous value (java.util.zip.CRC32C cannot be started at one):
   * for the rare fingerprint of a row inside a batch. */
  static final class Crc32c {
    private static final int[] TABLE = new int[256];

    static {
      for (int i = 0; i < 256; i++) {
        int c = i;
        for (int k = 0; k < 8; k++) {
          c = (c & 1) != 0 ? (c >>> 1) ^ 0x82F63B78 : c >>> 1;
        }
        TABLE[i] = c;
      }
    }

    static long update(long previous, byte[] data) {
      int crc = ~(int) previous;
      for (byte b : data) {
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >>> 8);
      }
      return ~crc & 0xFFFFFFFFL;
    }
  }
}
