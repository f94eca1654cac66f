import org.jgroups.*;

import java.nio.ByteBuffer;
import java.util.*;
import java.util.concurrent.*;

/**
 * JGroups 2.12 counterpart of `stackdemo perf` for the side-by-side script (strata's own code, not part of
 * JGroups): -members N in this JVM, the first -senders K of them (all by default) each send -count C messages
 * of -size S bytes to the group (-mode multicast) or to the next member (-mode unicast), with no application
 * window: JGroups' own flow control (UFC/MFC in its udp.xml) paces them. Every member checks per sender that
 * the seqnos come in order and that none is missing. An uncounted warm-up round of -warmup W messages per
 * sender (default: -count) runs first, for the JIT.
 * Prints "RESULT total_msgs_per_sec=... mean_member_msgs_per_sec=... seconds=... ok=true|false".
 */
public class Perf212 {
    static final int HDR = 1 + 4 + 8;

    String mode = "multicast", config = "udp.xml";
    int members = 2, senders = 0, count = 200000, size = 1000, warmup = -1;

    public static void main(String[] args) throws Exception {
        Perf212 p = new Perf212();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "-members": p.members = Integer.parseInt(args[++i]); break;
                case "-senders": p.senders = Integer.parseInt(args[++i]); break;
                case "-count": p.count = Integer.parseInt(args[++i]); break;
                case "-size": p.size = Integer.parseInt(args[++i]); break;
                case "-warmup": p.warmup = Integer.parseInt(args[++i]); break;
                case "-mode": p.mode = args[++i]; break;
                case "-config": p.config = args[++i]; break;
                case "-window": i++; break; // accepted for the shared flags; always 0 here
                default: System.err.println("Perf212: unknown flag " + args[i]); System.exit(2);
            }
        }
        if (p.senders <= 0 || p.senders > p.members) p.senders = p.members;
        if (p.warmup < 0) p.warmup = p.count;
        boolean ok = p.run();
        System.exit(ok ? 0 : 1);
    }

    final class Member extends ReceiverAdapter {
        final long[] next = new long[members];
        final CountDownLatch done;
        final List<String> errs = Collections.synchronizedList(new ArrayList<String>());
        volatile long first, last;
        long received;
        byte phase;

        Member(long expected) { done = new CountDownLatch(1); this.expected = expected; }
        long expected;

        @Override
        public synchronized void receive(Message msg) {
            ByteBuffer b = ByteBuffer.wrap(msg.getRawBuffer(), msg.getOffset(), msg.getLength());
            byte ph = b.get();
            int from = b.getInt();
            long seq = b.getLong();
            if (ph != phase) return; // a late warm-up message
            if (seq != next[from]) errs.add("from " + from + ": got " + seq + ", want " + next[from]);
            next[from] = seq + 1;
            long now = System.nanoTime();
            if (received == 0) first = now;
            last = now;
            if (++received == expected) done.countDown();
        }
    }

    boolean run() throws Exception {
        JChannel[] chs = new JChannel[members];
        for (int i = 0; i < members; i++) {
            chs[i] = new JChannel(config);
            chs[i].connect("perf212");
        }
        while (chs[0].getView().size() < members) Thread.sleep(100);
        List<Address> order = chs[0].getView().getMembers();
        boolean unicast = mode.equals("unicast");
        boolean ok = true;
        double total = 0, perMember = 0, seconds = 0;
        for (byte phase = (byte) (warmup > 0 ? 0 : 1); phase < 2; phase++) {
            final long cnt = phase == 1 ? count : warmup;
            Member[] ms = new Member[members];
            for (int i = 0; i < members; i++) {
                int from = (i - 1 + members) % members; // unicast: sender s sends to s+1
                long expect = unicast ? (from < senders ? cnt : 0) : (long) senders * cnt;
                ms[i] = new Member(expect);
                ms[i].phase = phase;
                chs[i].setReceiver(ms[i]);
            }
            long start = System.nanoTime();
            ExecutorService ex = Executors.newFixedThreadPool(senders);
            for (int s = 0; s < senders; s++) {
                final int idx = s;
                final byte ph = phase;
                final Address dest = unicast ? chs[(idx + 1) % members].getAddress() : null;
                ex.submit(new Callable<Void>() {
                    public Void call() throws Exception {
                        for (long seq = 0; seq < cnt; seq++) {
                            byte[] buf = new byte[size];
                            ByteBuffer.wrap(buf).put(ph).putInt(idx).putLong(seq);
                            chs[idx].send(new Message(dest, null, buf));
                        }
                        return null;
                    }
                });
            }
            ex.shutdown();
            for (int i = 0; i < members; i++) {
                if (ms[i].expected > 0 && !ms[i].done.await(300, TimeUnit.SECONDS)) {
                    System.out.println("member " + i + ": timed out with " + ms[i].received + " of " + ms[i].expected);
                    ok = false;
                }
            }
            long end = System.nanoTime();
            if (phase == 1) {
                seconds = (end - start) / 1e9;
                long all = 0;
                int counted = 0;
                for (Member m : ms) {
                    all += m.received;
                    if (m.received > 0 && m.last > m.first) {
                        perMember += m.received / ((m.last - m.first) / 1e9);
                        counted++;
                    }
                    if (!m.errs.isEmpty()) {
                        System.out.println("errors: " + m.errs.subList(0, Math.min(5, m.errs.size())));
                        ok = false;
                    }
                }
                total = all / seconds;
                perMember = counted > 0 ? perMember / counted : 0;
            }
        }
        for (JChannel ch : chs) ch.close();
        System.out.printf("RESULT total_msgs_per_sec=%.0f mean_member_msgs_per_sec=%.0f seconds=%.3f ok=%b order=%s%n",
                total, perMember, seconds, ok, order);
        return ok;
    }
}
