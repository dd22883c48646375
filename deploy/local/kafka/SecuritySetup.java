// SecuritySetup — run by deploy/local/kafka.sh on every start of a
// KAFKA_SECURITY=sasl_ssl broker, as user admin, in one JVM:
//
//   java -cp "<kafka libs>/*" SecuritySetup.java BOOTSTRAP SECURITY_DIR ACL_FILE USER...
//
// 1. sets the SCRAM-SHA-512 password of every user of USER... to the one in
//    SECURITY_DIR/passwords/<user>: it creates the users the cluster does
//    not have yet (a data dir formatted before a user was added to
//    KAFKA_SASL_USERS), and sets back a password changed on the cluster by
//    hand, so that the files kafka.sh credentials names always log in;
// 2. creates the ACLs of ACL_FILE (one kafka-acls.sh --add command a line,
//    without the connection arguments) that the cluster does not have yet;
// 3. deletes every other ACL of the principals ACL_FILE names (one removed
//    from the file, or granted by hand), allow or deny, on any host: the
//    file is all they hold. ACLs of other principals are left alone;
// 4. waits until the broker lists every user and every ACL of the file,
//    and none of those it deleted.
//
// Passwords are read from their files, never taken from the command line.
// It prints a line per ACL it deleted, as the kafka-acls.sh arguments that
// would grant it again, then one line saying what it did; errors go to
// stderr, exit 1.

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecuritySetup {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: SecuritySetup BOOTSTRAP SECURITY_DIR ACL_FILE USER...");
            System.exit(2);
        }
        Path dir = Path.of(args[1]);
        Set<AclBinding> acls = parse(Path.of(args[2]));
        List<String> users = List.of(args).subList(3, args.length);
        try (Admin admin = Admin.create(config(args[0], dir))) {
            List<String> missing = new ArrayList<>(users);
            missing.removeAll(scramUsers(admin));
            // Every user's, not only the missing ones': a password changed
            // by hand would leave its file, which the clients read, stale.
            List<UserScramCredentialAlteration> upserts = new ArrayList<>();
            for (String u : users) {
                upserts.add(new UserScramCredentialUpsertion(u,
                        new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password(dir, u)));
            }
            if (!upserts.isEmpty()) {
                admin.alterUserScramCredentials(upserts).all().get(60, TimeUnit.SECONDS);
            }
            Set<AclBinding> have = acls(admin);
            Set<AclBinding> absent = new LinkedHashSet<>(acls);
            absent.removeAll(have);
            if (!absent.isEmpty()) {
                admin.createAcls(absent).all().get(60, TimeUnit.SECONDS);
            }
            Set<String> managed = new HashSet<>();
            for (AclBinding b : acls) {
                managed.add(b.entry().principal());
            }
            List<AclBinding> stale = new ArrayList<>();
            for (AclBinding b : have) {
                if (managed.contains(b.entry().principal()) && !acls.contains(b)) {
                    stale.add(b);
                }
            }
            stale.sort((a, b) -> grant(a).compareTo(grant(b)));
            if (!stale.isEmpty()) {
                // An exact filter of each: it matches that ACL and no other.
                admin.deleteAcls(stale.stream().map(AclBinding::toFilter).toList()).all().get(60, TimeUnit.SECONDS);
                for (AclBinding b : stale) {
                    System.out.println("removed the ACL " + grant(b));
                }
            }
            // All of it reaches the broker through the metadata log.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (true) {
                Set<AclBinding> now = acls(admin);
                if (scramUsers(admin).containsAll(users) && now.containsAll(acls) && stale.stream().noneMatch(now::contains)) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("the broker does not list every user and ACL, or still lists one deleted, after 60 s");
                }
                Thread.sleep(100);
            }
            System.out.printf("created %s; set the SCRAM passwords of the %d users from %s; created %d of the %d ACLs; removed %d ACLs of their principals that the file does not list%n",
                    missing.isEmpty() ? "no SCRAM user" : "the SCRAM users " + String.join(" ", missing),
                    users.size(), dir.resolve("passwords"), absent.size(), acls.size(), stale.size());
        }
    }

    // The admin client: SCRAM-SHA-512 as admin over TLS, with the client
    // certificate the listener requires.
    static Properties config(String bootstrap, Path dir) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_SSL");
        p.put("sasl.mechanism", "SCRAM-SHA-512");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\""
                + password(dir, "admin") + "\";");
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", dir.resolve("ca.pem").toString());
        p.put("ssl.keystore.type", "PEM");
        p.put("ssl.keystore.certificate.chain", Files.readString(dir.resolve("client.pem")));
        p.put("ssl.keystore.key", Files.readString(dir.resolve("client-key.pem")));
        p.put("default.api.timeout.ms", "60000");
        return p;
    }

    static String password(Path dir, String user) throws Exception {
        return Files.readString(dir.resolve("passwords").resolve(user)).strip();
    }

    static Set<String> scramUsers(Admin admin) throws Exception {
        return admin.describeUserScramCredentials().all().get(60, TimeUnit.SECONDS).keySet();
    }

    static Set<AclBinding> acls(Admin admin) throws Exception {
        return new HashSet<>(admin.describeAcls(AclBindingFilter.ANY).values().get(60, TimeUnit.SECONDS));
    }

    // parse reads the ACL file: every line a kafka-acls.sh --add command's
    // principals, operations and resources; # starts a comment.
    static Set<AclBinding> parse(Path file) throws Exception {
        Set<AclBinding> out = new LinkedHashSet<>();
        int n = 0;
        for (String line : Files.readAllLines(file)) {
            n++;
            line = line.strip();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String where = file + ":" + n + ": ";
            List<String> principals = new ArrayList<>();
            List<AclOperation> ops = new ArrayList<>();
            List<ResourcePattern> resources = new ArrayList<>();
            List<String[]> named = new ArrayList<>();
            PatternType pattern = PatternType.LITERAL;
            String[] f = line.split("\\s+");
            for (int i = 0; i < f.length; i++) {
                String flag = f[i];
                if (flag.equals("--cluster")) {
                    named.add(new String[] {"cluster", "kafka-cluster"});
                    continue;
                }
                if (i + 1 >= f.length) {
                    throw new IllegalArgumentException(where + flag + " needs a value");
                }
                String v = f[++i];
                switch (flag) {
                    case "--allow-principal" -> principals.add(v);
                    case "--operation" -> ops.add(operation(where, v));
                    case "--topic", "--group", "--transactional-id" -> named.add(new String[] {flag, v});
                    case "--resource-pattern-type" -> pattern = switch (v) {
                        case "literal" -> PatternType.LITERAL;
                        case "prefixed" -> PatternType.PREFIXED;
                        default -> throw new IllegalArgumentException(where + "pattern type must be literal or prefixed, got " + v);
                    };
                    default -> throw new IllegalArgumentException(where + "unknown argument " + flag);
                }
            }
            for (String[] r : named) {
                ResourceType type = switch (r[0]) {
                    case "--topic" -> ResourceType.TOPIC;
                    case "--group" -> ResourceType.GROUP;
                    case "--transactional-id" -> ResourceType.TRANSACTIONAL_ID;
                    default -> ResourceType.CLUSTER;
                };
                resources.add(new ResourcePattern(type, r[1], type == ResourceType.CLUSTER ? PatternType.LITERAL : pattern));
            }
            if (principals.isEmpty() || ops.isEmpty() || resources.isEmpty()) {
                throw new IllegalArgumentException(where + "want a principal, an operation and a resource");
            }
            for (String p : principals) {
                for (AclOperation op : ops) {
                    for (ResourcePattern r : resources) {
                        out.add(new AclBinding(r, new AccessControlEntry(p, "*", op, AclPermissionType.ALLOW)));
                    }
                }
            }
        }
        return out;
    }

    // grant is b as the kafka-acls.sh --add arguments that create it, in
    // the file's form (plus --allow-host/--deny-host when not every host).
    static String grant(AclBinding b) {
        AccessControlEntry e = b.entry();
        ResourcePattern r = b.pattern();
        boolean deny = e.permissionType() == AclPermissionType.DENY;
        StringBuilder s = new StringBuilder(deny ? "--deny-principal " : "--allow-principal ").append(e.principal());
        if (!e.host().equals("*")) {
            s.append(deny ? " --deny-host " : " --allow-host ").append(e.host());
        }
        s.append(" --operation ").append(camel(e.operation().name()));
        switch (r.resourceType()) {
            case CLUSTER -> s.append(" --cluster");
            case TOPIC -> s.append(" --topic ").append(r.name());
            case GROUP -> s.append(" --group ").append(r.name());
            case TRANSACTIONAL_ID -> s.append(" --transactional-id ").append(r.name());
            case USER -> s.append(" --user-principal ").append(r.name());
            default -> s.append(" --").append(r.resourceType().name().toLowerCase(Locale.ROOT).replace('_', '-')).append(' ').append(r.name());
        }
        if (r.patternType() != PatternType.LITERAL) {
            s.append(" --resource-pattern-type ").append(r.patternType().name().toLowerCase(Locale.ROOT));
        }
        return s.toString();
    }

    // camel turns DESCRIBE_CONFIGS into DescribeConfigs, kafka-acls.sh's name.
    static String camel(String name) {
        StringBuilder s = new StringBuilder();
        for (String w : name.toLowerCase(Locale.ROOT).split("_")) {
            s.append(Character.toUpperCase(w.charAt(0))).append(w.substring(1));
        }
        return s.toString();
    }

    // operation maps kafka-acls.sh's names (Read, DescribeConfigs) to the enum.
    static AclOperation operation(String where, String name) {
        for (AclOperation op : AclOperation.values()) {
            if (op.name().replace("_", "").equalsIgnoreCase(name) && op != AclOperation.ANY && op != AclOperation.UNKNOWN) {
                return op;
            }
        }
        throw new IllegalArgumentException(where + "unknown operation " + name);
    }
}
