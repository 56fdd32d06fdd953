defmodule Heft do
  @moduledoc """
  An ETS-like table whose records live off the BEAM heap, compressed, in a
  memory-mapped arena, and which reports its memory in **bytes**.

  An ETS set holding `{i, :erlang.make_tuple(100, List.duplicate(:a, 10))}`
  costs 16,872 bytes per record on a 64-bit VM; Heft stores the same record
  in under 100. Heft speaks ETS's API: the same function names, arguments,
  return values and `ArgumentError`s, so porting code is mostly replacing
  `:ets` with `Heft`. Erlang code calls the same functions in the `heft`
  module (src/heft.erl).

  ## Usage

      iex> tab = Heft.new(:users, [:set, :public])
      iex> Heft.insert(tab, {1, %{name: "Ada"}})
      true
      iex> Heft.lookup(tab, 1)
      [{1, %{name: "Ada"}}]
      iex> Heft.info(tab, :memory) > 0
      true
      iex> Heft.delete(tab)
      true

  From Erlang:

      T = heft:new(users, [set, public]),
      true = heft:insert(T, {1, <<"Ada">>}),
      [{1, <<"Ada">>}] = heft:lookup(T, 1).

  ## How records are stored

  Each record is encoded in the Heft term format (a compact relative of the
  external term format that keeps atoms as per-table ids and keeps subterms
  the BEAM shares, and equal ones, stored once; see docs/term-format.md),
  compressed with
  raw deflate when that saves space, and copied into the table's arena:
  memory (`arena: :memory`, RAM then swap, never written back to a file)
  or a 0600 file in a directory you name (`arena: {:file, dir}`, for data
  larger than RAM), or both: memory first, up to a budget, then the file
  (`arena: {:file, dir, memory: bytes}`, below). The key index lives in
  native memory. Lookups copy the record to the caller's heap, like ETS.

  A tiered arena (`arena: {:file, dir, memory: bytes}`) keeps records in
  memory (as a memory arena) up to `bytes` of them, and the records read
  least in its file. One background thread for all such tables moves
  them out once memory holds more than the budget, which records go
  chosen by SIEVE (a lookup marks its key; the oldest unmarked key in
  memory goes first, with all its objects), in steps of at most 256 KiB
  under the table's lock, and it starts the writeback of what it wrote
  at once and waits for it every 8 MiB, so the file's pages are soon
  clean (the kernel can drop them without writing) and it never writes
  faster than the disk. Writes never wait for it: past the budget and an
  eighth, new records go straight to the file. A record read from the
  file faults in its own pages only (the file is mapped `MADV_RANDOM`);
  a record written again comes back to memory. Nothing of a table that
  fits its budget is ever written to disk. Calls run on normal
  schedulers until some record is in the file, then on dirty I/O
  schedulers, as a file arena's do. The file is not compacted (its free
  blocks are reused); `compact/1` compacts memory. `info(tab, :tier)`
  says what each tier holds. What cannot move to the file (the key index,
  the queue of keys in memory, deadlines, an eviction queue) counts
  against the budget too: once it alone takes the budget, a write that
  would add a key (in a bag, an object) returns `{:error,
  :memory_budget}` and changes nothing; deletes make room again (a hash
  index shrinks once a quarter full). A persistent table can keep its
  working copy in a tiered arena (`persist:` with `arena:`), so a table
  larger than the memory it may use opens and serves. The budget is for
  records (memory may hold an eighth more while the mover catches up):
  under a cgroup limit, leave room beside it for the VM, the index and
  the page cache (docs/benchmarks.md: a 96 MiB budget in a 256 MiB
  limit left too little; 48 MiB served).

  A memory arena is anonymous memory on transparent huge pages
  (`MADV_HUGEPAGE`; 2 MiB pages where the host's THP setting for
  anonymous memory is `always` or `madvise`), a mapping of its own
  between guard pages, named `heft:<name>` where the kernel names
  anonymous memory (Linux 5.17+ with `CONFIG_ANON_VMA_NAME`: smaps shows
  `[anon:heft:<name>]`); elsewhere it is unnamed in /proc/self/maps and
  `Heft.Memory` finds it by address. Where the kernel refuses huge pages
  for it, the arena is a memfd instead (`/memfd:heft:<name> (deleted)`,
  4 KiB pages unless shmem huge pages are enabled). On huge pages the
  arena's resident memory grows in 2 MiB steps: `:arena_resident_bytes`
  runs up to 2 MiB ahead of `:arena_used_bytes`, and the pages of a large
  freed block that go back to the kernel split the huge page they were in.

  ## Table semantics

  Table types, as in ETS:

    * `:set` (the default) - one object a key. Keys compare by match
      (`=:=`): `1` and `1.0` are different keys, and on OTP 25 `0.0` and
      `-0.0` are the same.
    * `:ordered_set` - one object a key, keys in Erlang term order
      (`first/1`, `next/2`, `last/1`, `prev/2`, `foldl/3`, `foldr/3`,
      `tab2list/1` and `stream/1` follow it). Keys compare by `==`: `1` and
      `1.0` are the same key, and the key kept is the one of the object
      inserted last. Keys are ordered in native code, on their stored
      bytes, exactly as `Kernel.</2` orders them.
    * `:bag` - any number of objects a key, but no two that match (`=:=`);
      inserting an object already there changes nothing.
    * `:duplicate_bag` - any number of objects a key, copies included.

  In a bag, a key's objects come back in insertion order, except that on
  OTP 26 and older the objects of one `insert/2` list go in last to first,
  as in ETS there (a `:duplicate_bag` keeps list order on every release).
  `info(tab, :size)` counts objects. Any term can be a key or a value.

  Where ETS changed between OTP releases, Heft does what the ETS of the VM
  it runs on does, learnt from that ETS when Heft loads: whether `0.0` and
  `-0.0` are one key (up to OTP 26), the order of a bag's list (above),
  whether a map in the key of a match pattern matches larger maps (from
  OTP 27; before, such a key is looked up and matches only an equal map),
  what `foldl/3` and `foldr/3` do at an object whose key is
  `:"$end_of_table"` (up to OTP 26 the walk stops there; from OTP 27 a set
  or bag walks on and an ordered_set raises `ArgumentError` after folding
  that key's objects) and whether `{:heir, pid}` without data is an option
  (OTP 29).

  Walks: in a set or bag, `last/1` is `first/1` and `prev/2` is `next/2`,
  and `foldr/3` visits keys in `foldl/3`'s order, a bag key's objects last
  to first, all as in ETS.

  A table belongs to the process that created it and is deleted when that
  process exits, unless an heir takes it: the heir then receives
  `{:"HEFT-TRANSFER", tab, from_pid, heir_data}`. As in ETS, the table
  has been deleted or handed over by the time anyone receives the owner's
  `EXIT` or `DOWN`: the name is free (a supervisor's restart of the owner
  creates it again), `all/0`, `whereis/1` and `info/1` no longer know the
  table, its handles raise, or the heir owns it (its transfer message,
  though, may arrive after that `EXIT` or `DOWN`: see "Differences from
  ETS"). `:protected` (the
  default) lets every process read and only the owner write, `:private`
  lets only the owner do either, `:public` lets everyone do both.

  > #### Differences from ETS {: .info}
  >
  > - `info(tab, :memory)` is in **bytes**; ETS's is in words (multiply by
  >   `:erlang.system_info(:wordsize)`). `info/1` has more, all in bytes.
  > - In a set or ordered_set, equal compound parts of an object (tuples,
  >   lists and maps but the tiniest, such as `{}` or `{1}`; binaries and
  >   pids of 14 bytes or more) are stored once
  >   and read back as one shared term, however the object was built: a
  >   lookup of `{:t, 1, :erlang.make_tuple(100, List.duplicate(:a, 10))}`
  >   read from a socket (2,105 words, nothing shared) answers 125 words.
  >   The answer is `=:=` to what was inserted (floats compared bit for
  >   bit: `0.0` and `-0.0` are never merged) and no Erlang code tells it
  >   apart, except `:erts_debug.size/1`, which counts shared parts once.
  >   ETS answers the sharing the object had (none here). A small integer
  >   (below 2^59 in magnitude), atom or binary equal to the key is stored
  >   as a mention of the key (so `{id, %{id: id}}` holds the id once), and
  >   such a binary comes back as the key's binary. Bags store each object
  >   as written out in full.
  > - The owner-transfer message is tagged `:"HEFT-TRANSFER"`.
  > - A reference that stands for an object of the VM (the references of
  >   `:atomics`, `:counters`, ETS tables and NIF resources) keeps its
  >   object alive while a record holds it, as in ETS, except inside a
  >   fun's captured variables: there it is stored as a reference only,
  >   and once no process holds it the object is freed and the stored
  >   reference is stale (`:atomics.info/1` of it raises).
  > - An unnamed table is a `Heft.Table` struct, not a reference.
  > - `next/2` accepts a key that is no longer in the table and continues
  >   from where it was (ETS raises unless the table is fixed), so a
  >   `first/next` walk is safe while other processes write, whether or
  >   not the table is fixed with `safe_fixtable/2`. (The key
  >   `:"$end_of_table"` raises, as in ETS.)
  > - `info(tab, :heir)` is `:none` once the heir has exited (OTP 25's ETS
  >   still names the dead process).
  > - `slot/2` numbers the hash index's buckets (set and bags), so a table
  >   has other slot numbers than in ETS; an ordered_set's slot `i` is its
  >   `i`-th object, as in ETS.
  > - `init_table/2` raises `ArgumentError` where ETS exits (an object
  >   that does not fit, a fun's bad answer), and refuses a non-function
  >   before deleting anything.
  > - `tabfile_info/1` of a Heft table file (see `tab2file/3`) answers
  >   `file2tab/2`'s error reasons (of a file of ETS's, ETS's). `i/0` lists Heft tables, with
  >   their memory in bytes; `i/0` and `i/1` print terms with `inspect/1`.
  > - Counters (`update_counter/3,4`) work up to ±2^127; ETS has no limit
  >   (`ArgumentError` naming the limit beyond, for an operand or a stored
  >   element).
  > - Maps may nest at most 64 deep inside a key or a bag's object
  >   (`ArgumentError` beyond): encoding them canonically recurses. An
  >   insert holding such an object raises and inserts nothing; such a key
  >   is in no table, so `lookup/2`, `member/2`, `take/2`, `delete/2`,
  >   `delete_object/2` and `update_element/3` answer as for a missing key.
  >   The other elements of a set's or ordered_set's objects may nest maps
  >   as deep as the VM allows, and every function handles them (objects
  >   are compared with `=:=`).
  > - `foldl/3` and `foldr/3` raise `ArgumentError` for a `fun` that is not
  >   a function, even on an empty table (ETS returns the accumulator
  >   there), and for a function of another arity once the table has an
  >   object (ETS raises `FunctionClauseError` there; on an empty table
  >   both return the accumulator).
  > - A continuation of `select/3`, `select_reverse/3`, `match/3` or
  >   `match_object/3` belongs to the table it walks: it raises
  >   `ArgumentError` once that table is deleted, even when another table
  >   took its name and even with results already buffered (ETS continues
  >   a named ordered_set's walk in the new table), and it keeps working
  >   after `rename/2`.
  > - A chunk of `select/3` and its family that fills its limit at the end
  >   of a set or bag answers a continuation, and the next call
  >   `:"$end_of_table"`. ETS answers `:"$end_of_table"` at once when that
  >   end falls in its hash table's last bucket: Heft hashes keys with a
  >   random key per table, so there that end would come by chance.
  > - Bad file names and options of `tab2file/3`, `file2tab/2` and
  >   `open/2` raise `ArgumentError` (ETS's `tab2file` and `file2tab`
  >   return some of them as `{:error, reason}`). `insert/3` and
  >   `insert_new/3` with `sync: :commit` raise, before writing, on a table
  >   that is not persistent.
  > - A bag compares a new object with each object of its key, inflating
  >   compressed ones of the same size, while holding the table's write
  >   lock: keys with thousands of objects make inserts slow (in ETS too,
  >   but less). A chunk of `stream/1`, `foldl/3` or `tab2list/1` holds all
  >   of a bag key's objects, however many.
  > - A fun stored in a set's key or a bag's object matches only funs
  >   created by the same process (its external format names the creator;
  >   `=:=` ignores it). Ordered_set keys compare funs as the VM does.
  > - `select/2` and its family also look objects up by key when a guard
  >   pins the key (`[{{:"$1", :_}, [{:==, :"$1", 42}], [:"$_"]}]`, as
  >   `:ets.fun2ms/1` writes `fn {k, _} when k == 42`); ETS scans the table
  >   for that and only looks up keys written literally in the head. In an
  >   `:ordered_set`, guards that bound the key variable (`k >= 100 and
  >   k < 200`) make it walk only that key range, as ETS does for a key
  >   bound in part (`{{:user, :_}, :_}`), which Heft walks as a range too.
  > - `tab2file/3` writes Heft's own format (docs/tab-file.md), which
  >   `:ets.file2tab/2` cannot read: it carries the table's compression
  >   and zstd dictionaries, so that the table read back compresses as the
  >   one written did, and checksums every frame. `file2tab/2` reads both
  >   Heft's files and ETS's (a `disk_log`), so a table dumped by ETS loads
  >   into Heft.
  > - When the owner dies, an heir linked to it may receive the owner's
  >   `EXIT` before the `:"HEFT-TRANSFER"` message (ETS queues its
  >   `:"ETS-TRANSFER"` first), and an heir monitoring it, its `DOWN`, if
  >   that monitor is older than the owner's ownership (a table given away
  >   to a process the heir already monitored). ETS hands the tables over
  >   inside the VM before it sends the owner's `EXIT` signals; a NIF
  >   learns of the death only from a monitor, which the VM fires after the
  >   links' `EXIT`s, in the order the monitors were set. The
  >   heir owns the tables when it sees the `EXIT` all the same (every call
  >   on a table whose owner has died hands it over first), and the message
  >   follows. A heir that relies on the order should `receive` the transfer
  >   message, not infer it from the `EXIT`.
  > - `:read_concurrency`, `:write_concurrency` and `:decentralized_counters`
  >   are accepted and ignored: readers never block each other, and writers
  >   hold the table's lock only to copy bytes, not to encode or compress.
  >   `info/2` answers what is true of Heft (`true`, `false`, `false`),
  >   and `:compressed` is `true` unless `compression: :none`.
  > - `lookup_element/4` (ETS: OTP 26 and later), `update_element/4`,
  >   `first_lookup/1`, `next_lookup/2`, `last_lookup/1` and
  >   `prev_lookup/2` (OTP 27 and later) are Heft's on every release. A
  >   `*_lookup` step is a walk step followed by `lookup/2` (a key deleted
  >   between the two is passed over), not one atomic read as in ETS.
  > - What ETS does inside its own tables, which OTP's ets_SUITE checks
  >   and Heft does otherwise (test/otp_ets/README.md runs that suite
  >   against Heft on OTP 25, 27 and 29; these are the cases it fails on
  >   every release): the memory of tables and objects in words, per lock
  >   and per object (`memory`, `write_concurrency`); the
  >   reference-counted binaries a table shares with processes
  >   (`info(tab, :binary)`, always `[]`: `info`, `info_binary_stress`);
  >   objects deleted from a fixed hash table kept until it is released,
  >   and counted by `info(tab, :stats)`, which Heft does not have (it
  >   deletes at once: `t_delete_object`, `t_delete_all_objects`,
  >   `grow_pseudo_deleted`, `shrink_pseudo_deleted`, `smp_fixed_delete`,
  >   `smp_unfix_fix`); its hash buckets' load and order (`smp_insert`,
  >   `match2`); a large delete, `delete_all_objects/1` or owner exit
  >   carried out in slices the caller is rescheduled between (Heft hands
  >   a large arena to a thread of its own: `delete_large_tab`,
  >   `t_delete_all_objects_trap`, `exit_large_table_owner`,
  >   `exit_many_large_table_owner`, `exit_many_tables_owner`,
  >   `exit_many_many_tables_owner`); decentralized counters
  >   (`test_decentralized_counters_setting`); the `error_info` of its
  >   exceptions and its tables' references (`error_info`); the layout of
  >   its continuations, which the suite edits (`t_repair_continuation`:
  >   Heft's `select/1` also recompiles a lost match specification itself
  >   instead of raising). The differences above account for `default`
  >   (`:compressed`), `tab2file` (`:write_concurrency`, and bad options
  >   raising), `fixtable_insert` (`next/2`) and `heir` and `give_away`
  >   (the transfer message's order). (The suite's `tab2file` calls ask
  >   for ETS's format, `format: :ets`, which it reads with `disk_log`.)

  ## Compression

  Each record's body is compressed on its own, with the table's codec
  (`compression:` of `new/2`), only where that pays (incompressible bodies
  are stored as they are by every codec; docs/term-format.md, "Records in
  the arena"):

    * `:zlib` (default) - raw deflate; `:none`; `:lz4` - the fastest to
      decode, the least saved; `:zstd` / `{:zstd, level: 1..22}` - zstd
      frames without magic number, checksum or size fields.
    * `{:zstd, dictionary: :auto}` - zstd with a dictionary trained from the
      table's own records, which finds what records have in common (map
      keys, field names, JSON structure) that no record shows on its own.
      The table trains on its own when it first holds 4,096 records, and
      again each time it has grown four times over since (16,384, 65,536,
      ... records), its records having perhaps drifted from those it
      learnt from; `train_dictionary/2` retrains on demand. A dictionary is
      only put in use if it beats zstd alone on records it was not trained
      on; one trained on its own as the table grew, only if it also stores
      them in 1/32 fewer bytes than the current one and saves more over the
      table than it takes (every dictionary stays for good). Each
      record is one bare zstd block begun from the dictionary (its
      entropy tables too), which is what lets records of a few dozen bytes
      shrink. The level is 9 unless given: on the bench's records it
      stored 2-9% fewer bytes than level 3 (the 1 KB JSON-like record:
      140 B against 154 B) for about three times the compression time of a
      write, and decodes as fast; level 19 saved 9% more on that record
      but took ten times as long to write.
    * `:auto` - the table starts with zstd and, at 4,096 records (and on
      `train_dictionary/2`), measures none, lz4, zstd, zstd with a
      dictionary and zlib on its own records: of the codecs storing them
      in at most 17/16 of the fewest bytes, the one decoding them fastest
      wins. While its choice is zstd with a dictionary it measures them
      again at each fourfold growth: another codec may win, and a new
      dictionary replaces its own only if it pays as above. `info(tab, :compression)` shows `{:auto, choice}`,
      and `info(tab, :training)` what each codec did.

  Records name the dictionary they were compressed with: a new dictionary
  applies to new writes and older records stay readable; a background job
  then re-compresses older records with it (or with `:auto`'s new choice).
  Training and re-compression run on a thread of their own, off the
  schedulers, holding the table's lock only to copy out or swap in a chunk
  of 256 records: readers and writers are never stopped. Progress shows in
  `info(tab, :recompression)`, dictionaries in `:dictionaries` and
  `:dictionary_bytes` (counted in `:memory`). The number of samples and
  the dictionary size were chosen by measurement (docs/term-format.md,
  "Dictionaries"). Persistent tables take `:zlib` and `:none` only, for now.

  ## Persistence

  `Heft.new(name, persist: dir)` makes a disc-backed table: the records
  stay in memory (the working copy, which the kernel never writes back to
  disk) and every change is appended to a write-ahead log in `dir` before
  the call returns. From time to time the log is folded into a snapshot
  (a *dump*, as Mnesia calls it), without stopping readers or writers.
  `open/2` reopens a table after a restart, `close/1` closes it, `sync/1`
  and `dump/1` force a sync or a dump, `subscribe/1` reports overload.

      tab = Heft.new(:sessions, persist: "/var/lib/app/sessions", sync: :commit)
      Heft.insert(tab, {"s1", %{user: 7}})   # returns once on disk
      Heft.close(tab)
      {:ok, tab} = Heft.open("/var/lib/app/sessions")

  What each `:sync` mode guarantees:

  | mode              | VM crash          | power loss / kernel crash          |
  | ----------------- | ----------------- | ---------------------------------- |
  | `:none`           | nothing lost      | the writes since the log's last sync, newest first |
  | `{:interval, ms}` | nothing lost      | at most about the last `ms` of writes |
  | `:commit`         | nothing lost      | nothing acknowledged is lost       |

  In every mode a crashed table opens without repair and is what it was
  after some prefix of its writes: a write batch (one `insert/2` of a
  list) is recovered entirely or not at all, never a later write without
  an earlier one, dumps included (docs/persistence.md). Concurrent `:commit` writers share one fsync (group commit): while
  committers arrive several at a time, the table's flusher waits up to
  half an fsync's duration (at most 0.5 ms) for more of them before it
  syncs; a lone committer never waits. A waiting writer blocks only its
  own process: no scheduler waits for the disk. `insert(tab, objects, sync: :commit)` asks for a commit on one
  call of a table in another mode.

  Opening a directory loads the snapshot and replays the log. A torn tail
  (the last write, cut short by a crash, or log pages a power loss kept
  from the disk) is cut off and counted in
  `info(tab, :recovered_torn_bytes)`; damage before it makes `open/2`
  return `{:error, {:corrupt, file, offset}}` (or `{:error, {:missing,
  file}}` for a file the table's MANIFEST says must exist) unless
  `repair: true`; a table closed cleanly has no torn tail, so a cut at the
  end of its log is damage too. docs/persistence-format.md lists every kind
  of damage and what each gets. A table's compression and its zstd
  dictionaries are persisted with it: each dictionary is logged before
  the first record compressed with it and is in every snapshot, so a
  reopened table reads every record with the dictionary it names and
  writes with the newest. Re-compressing older records (after
  `train_dictionary/2`) is not logged; the next dump stores them
  re-compressed (re-compressed records count toward
  `dump_log_write_threshold`).
  Files are mode 0600 in a 0700 directory, never opened through a symbolic
  link, and the directory is locked
  while open (`{:error, :locked}` for a second open, even in the same VM).
  File formats: docs/persistence-format.md.

  > #### Ownership {: .info}
  >
  > A persistent table whose owner exits without an heir is **closed**
  > (its log synced, its files kept), not deleted: reopen it with
  > `open/2`. `delete/1` removes its files.

  > #### Errors {: .warning}
  >
  > When the disk is full, a write returns `{:error, :enospc}` and changes
  > nothing; the table stays readable. After a failed fsync the table
  > refuses writes with `{:error, :poisoned}` until it is reopened, since
  > the kernel may have dropped the unsynced pages.

  ## Budgets and eviction

  `max_records: n` and `max_bytes: n` (options of `new/2` and `open/2`)
  bound a table, which then keeps within the bound by *evicting* keys, as
  a cache does. ETS has no such thing: in a bounded table an insert can
  make other keys disappear.

    * `max_records` counts records (`info(tab, :size)`; every object of a
      bag). `max_bytes` counts what `info(tab, :memory)` counts (index,
      arena, dictionaries, the atom dictionary and the eviction queue) but
      for the arena's free blocks: evicting a record frees its block for
      later writes. The blocks of keys evicted one after another lie side
      by side and are merged, so they take the next records whatever
      their sizes (under a stream of new keys `:memory` stays within about
      1% of the budget); free blocks that do not fit the next records go
      back to the kernel by compaction (sooner in a bounded table: once
      they pass 1/64 of the budget), and `:memory` comes back within the
      budget once it has run.
    * A write that takes the table over its bound evicts keys, each with
      all its records, before it returns. A write on a normal scheduler
      evicts at most 64 keys and brings in at most 64 KiB (a larger one
      moves to a dirty scheduler); what it could not evict, later writes
      do.
    * Which keys go: the policy is SIEVE, chosen by measurement against
      LRU, CLOCK and S3-FIFO (docs/benchmarks.md, "Eviction policies":
      its hit ratios are above LRU's on every stream, by up to 5 points). The
      table queues its keys in the order they arrived; a *read* marks a
      key; the eviction hand walks from the oldest key, sparing marked
      ones, and evicts the first unmarked one. A read is a call that looks
      one key up: `lookup/2`, `lookup_element/3,4`, `member/2`, `take/2`,
      `update_counter/3,4`, `update_element/3,4` and `select`/`match`
      with the key bound; a write that replaces a key's record marks it
      too. Walks (`select`, `match`, `foldl/3`, `first/1`, `next/2`,
      `tab2list/1`) do not, so a scan does not make keys stay. Marks are
      kept per hash bucket, not per key (docs/benchmarks.md gives the
      cost in hit ratio).
    * In a persistent table an eviction is logged as a delete, so a
      reopened table holds what the table held. The bound is not stored:
      pass it again to `new/2` or `open/2` (a table reopened over a lower
      bound evicts down to it at once).
    * `info(tab, :budget)`: `nil` for an unbounded table, else
      `%{max_bytes:, max_records:, used_bytes:, queue_bytes:,
      evicted_keys:, evicted_records:, hits:, misses:}` - the bounds, what
      `max_bytes` counts now, the eviction queue's part of it (about a
      byte a key besides the key's own bytes, and 2 to 4 bytes of marks),
      what was evicted, and the reads that found their key and those that
      did not (counted only in bounded tables).

  ## Expiry

  `ttl: ms` (an option of `new/2` and `open/2`) gives a table a time to
  live: a key expires `ms` milliseconds after the write that stored it.
  `insert/3` and `insert_new/3` take `ttl: ms` (`0` included) or
  `ttl: :infinity` for the keys of one write, in any table. ETS has no
  such thing: in a table with expiry, keys disappear on their own.

    * An expired key is gone at once for every call: `lookup/2`,
      `member/2` and the other calls on one key answer as for a missing
      key, walks (`select/2` and its family, `foldl/3`, `tab2list/1`,
      `first/1`, `next/2`, `slot/2`, streams) pass over it, and
      `insert_new/2` inserts where it was. A write that names an expired
      key removes it first (logged as a delete in a persistent table),
      so `update_counter/4` starts again from its default.
    * Expired keys still hold memory until they are removed: a sweep
      removes them, earliest deadline first, on a thread of its own (256
      keys per hold of the table's lock, resting between holds as long
      as it held it; it looks every 100 ms). Until it has, `info(tab,
      :memory)` counts them. In a persistent table each removal is logged
      as a delete. A bounded table (see "Budgets and eviction") over its
      bound removes expired keys before it evicts a live one.
    * Which writes set a key's deadline: `insert/2,3` and
      `insert_new/2,3`, from the time the write is applied: its own
      `ttl:`, else the table's; a key written with neither has none
      (`ttl: :infinity` in a table with a `ttl` keeps a key for good).
      `update_counter/3,4`, `update_element/3,4` and `select_replace/2`
      keep the key's deadline; a key they create gets the table's. In a
      bag the deadline is the key's: each insert of the key sets it for
      all its objects.
    * Time is the VM host's monotonic clock, in milliseconds: deadlines
      do not move when the wall clock is set.
    * Deadlines are not stored: `open/2` gives every key of the table it
      loads the `ttl` it is given, from the time it opens; a table opened
      without `ttl` has no expiry. `close/1` removes the expired keys
      first, so they do not come back; after a crash, keys that had
      expired but were not yet swept are loaded with the rest.
    * `info(tab, :expiry)`: `nil` for a table that never had a deadline,
      else `%{ttl:, expiring_keys:, expired_keys:, expired_records:,
      bytes:}` - the table's time to live (`nil`: none), the keys that
      have a deadline and are not yet removed, the keys and records
      removed because they expired, and the bytes the deadlines take
      (about 100 a key besides the key's own bytes; counted in
      `:meta_bytes`, `:memory` and a `max_bytes` budget).

  ## Scheduling

  No call runs much longer than a millisecond on a normal scheduler: big
  batches and big terms move to a dirty CPU scheduler, as does a write
  that would resize a large key index (grow or shrink it: tens of
  milliseconds at a million keys) or empty a large table, before it
  changes anything, whatever order of operations led there; every operation
  on a file-backed table (or a tiered one with records in its file) runs
  on a dirty I/O scheduler, as do opening and
  closing a persistent table. A write to a persistent table stays on its
  scheduler: its log append is a copy into a mapped, preallocated log file
  (no system call); only when the log needs a new file that is not ready
  does the write move to a dirty I/O scheduler to make it. Fsyncs, new log
  files and dumps are the work of the table's own two threads.

  A call whose work grows with its input or output (a walk's or a
  select's chunk, a list of objects written or deleted) charges its
  process reductions for the time it took, as ETS's `select/2` charges
  for the objects it examines: 1% of a timeslice (40 reductions) per
  microsecond, less any wait for the table's lock. A process scanning a
  large table therefore yields between chunks, and the short calls of
  other processes on its scheduler do not wait behind the whole scan.

  A call that finds the table locked by a long change (a resize, emptying
  a large table) waits for it at most 200 µs on its normal scheduler,
  then waits on a dirty CPU scheduler instead, having changed nothing. A
  resize of a large set or bag index lays the new index out while readers
  go on; only the table's writers wait for it (15 ms at a million keys
  and 22 ms at 1.5 million on an idle core, up to 100 ms when readers and
  a compaction keep the cores busy: docs/benchmarks.md, "Readers and a
  writer while compacting"). ETS grows its hash table a bucket at a time,
  so its writers do not wait so long.
  """

  import Heft.Native, only: [call: 1]
  alias Heft.Native

  @typedoc "A table: a `Heft.Table` identifier, or the name of a named table."
  @type tab :: Heft.Table.t() | atom

  @typedoc "One record: a tuple holding its key at the table's keypos."
  @type object :: tuple

  @chunk 256

  @doc """
  Creates a table. Returns its identifier, or `name` with `:named_table`.

  Options (ETS's, plus Heft's own):

    * `:set` (default), `:ordered_set`, `:bag`, `:duplicate_bag` - the
      table type (see "Table semantics").
    * `:named_table` - register the table under `name`.
    * `:public`, `:protected` (default), `:private` - who may read and write.
    * `{:keypos, n}` - the element that holds the key (default 1).
    * `{:heir, pid, data}` or `{:heir, :none}` (default) - who takes the
      table when the owner exits. On a VM whose ETS has it (OTP 29),
      `{:heir, pid}` too: the heir takes the table without a transfer
      message.
    * `compression:` how record bodies are compressed (see
      "Compression"): `:zlib` (default) - per-record raw deflate, kept only
      where it saves at least 1/8 of the record; `:none`; `:lz4` - fastest
      to decode; `:zstd` - zstd level 3; `{:zstd, level: 1..22,
      dictionary: :none | :auto}` - with `dictionary: :auto` the table
      trains a dictionary from its own records once it holds 4,096 of
      them, again at four times as many (and `train_dictionary/2` trains
      one on demand), level 9 unless given; `:auto` - the
      table measures every codec on its own records and picks one.
      zstd and lz4 keep a compressed body only if it saves at least 1/16
      of it (a dictionary block: a byte, zstd refusing less than ~1/64). `:compressed` (ETS's option) means `compression: :zlib`.
      A persistent table stores its compression (and its dictionaries)
      with it: `open/2` reopens it with the same.
    * `compression_level: 0..9` - zlib's level for records over 4 KiB
      (default 1); shorter ones are deflated by Heft's own fast encoder
      (fixed Huffman codes), whatever the level.
    * `arena: :memory` (default), `{:file, dir}` or `{:file, dir, memory:
      bytes}` - RAM (huge pages, or a memfd; see "How records are
      stored"), or a file in the existing directory `dir` (mode 0600; gone
      from `dir` when `delete/1` returns, its pages unmapped in the
      background), or memory for up to `bytes` (a positive integer) of
      records and that file for the rest (a tiered arena).
    * `max_bytes: n`, `max_records: n` (positive integers; default `nil`,
      unbounded) - bound the table, which then evicts keys to stay within
      the bound (see "Budgets and eviction"): `max_records` counts
      records (`info(tab, :size)`), `max_bytes` the bytes of
      `info(tab, :memory)` but for the arena's free blocks.
    * `ttl: ms` (a positive integer of milliseconds; default `nil`, no
      expiry) - each key expires `ms` after the write that stored it,
      unless the write gave its own `ttl:` (see "Expiry").
    * `{:read_concurrency, _}`, `{:write_concurrency, _}`,
      `{:decentralized_counters, _}` - accepted for compatibility, ignored.

  Persistence (see "Persistence" in the module doc):

    * `persist: dir` - keep the table on disk in `dir` (created, mode
      0700, if missing; an existing one open to its group or others is
      tightened to 0700, one owned by another user is refused with
      `:eperm`). If `dir` already holds a Heft table, it is loaded
      (its type and keypos must match these options; the other options
      given here replace the stored ones). The working copy is in memory
      unless `:arena` says otherwise: `{:file, dir, memory: bytes}`
      keeps it in memory up to `bytes` of records and the rest in a
      scratch file in `dir` (a tiered arena), for a table larger than
      the memory it may use. The log and snapshot stay the durable copy:
      the arena is not stored, and `open/2` loads the table into the
      arena it is given (memory by default).
    * `sync: :none` (default), `{:interval, ms}` or `:commit` - when a
      write reaches stable storage.
    * `dump_log_write_threshold: n` - fold the log into a new snapshot
      once it holds `n` writes (default 50,000), and at least half as
      many writes as the table held records at its last dump: a dump
      writes every record, so a large table under steady writes is not
      rewritten whole every `n` writes (writing a table's worth of records
      costs at most about two dumps of it; opening replays at most that
      much log). Unlike Mnesia's option of the same name, which folds its
      log into the tables' files incrementally.
    * `dump_log_time_threshold: ms` - ...or once `ms` have passed since
      the last dump and the log holds any write (default 180,000).
    * `repair: true` - as for `open/2`.

  Raises `ArgumentError` naming the option for an unknown or ill-typed
  option, or if a named table called `name` exists. Raises `Heft.Error` if
  the arena cannot be created (reason `:enoent`, `:eacces`, `:enospc`...)
  or a persistent table cannot be opened (reasons as for `open/2`).
  """
  @spec new(atom, list) :: tab
  def new(name, opts \\ [])

  def new(name, opts) when is_atom(name) and is_list(opts) do
    unless Heft.Args.proper_list?(opts) do
      raise ArgumentError, "Heft.new/2 expects a proper list of options, got: #{inspect(opts)}"
    end

    {persist, opts} = Heft.Persist.split_options(opts)
    {o, args} = parse_options(opts)

    result =
      cond do
        persist != nil -> Heft.Persist.new!(name, o, args, persist)
        o.arena == :memory -> Native.new(name, args)
        true -> Native.new_io(name, args)
      end

    case result do
      {:error, reason} ->
        raise Heft.Error, reason: reason, action: "create the arena of #{inspect(name)}"

      tab ->
        tab
    end
  end

  def new(name, opts) do
    raise ArgumentError,
          "Heft.new/2 expects an atom name and a list of options, got: #{inspect(name)}, #{inspect(opts)}"
  end

  @doc false
  # Heft.new/2's options, checked: `{options map, arguments of the NIF}`
  # (Heft.Persist reuses it to reopen a table from its stored options).
  def __parse_options__(opts) do
    o = Enum.reduce(opts, default_options(), &option/2)
    compression = native_compression(o.compression, o.level)

    arena =
      case o.arena do
        :memory -> :memory
        {:file, dir} -> {:file, dir}
        {:file, dir, memory: bytes} -> {:file, dir, bytes}
      end

    {o,
     {o.type, o.named, o.protection, o.keypos, o.heir, compression, arena,
      {o.max_bytes, o.max_records}, o.ttl}}
  end

  defp parse_options(opts), do: __parse_options__(opts)

  # The compression as the NIF takes it (native/heft_nif/src/admin.rs
  # `compression_of`).
  defp native_compression(:zlib, level), do: {:zlib, level}
  defp native_compression(:zstd, _level), do: {:zstd, 3, false}
  defp native_compression({:zstd, o}, _level), do: {:zstd, o[:level], o[:dictionary] == :auto}
  defp native_compression(other, _level) when other in [:none, :lz4, :auto], do: other

  defp default_options do
    %{
      type: :set,
      named: false,
      protection: :protected,
      keypos: 1,
      heir: :none,
      compression: :zlib,
      level: 1,
      arena: :memory,
      max_bytes: nil,
      max_records: nil,
      ttl: nil
    }
  end

  defp option(type, o) when type in [:set, :ordered_set, :bag, :duplicate_bag],
    do: %{o | type: type}

  defp option(:named_table, o), do: %{o | named: true}
  # As in ETS: :public and :private set the protection (the last one
  # wins); :protected, the default, changes nothing.
  defp option(:protected, o), do: o
  defp option(p, o) when p in [:public, :private], do: %{o | protection: p}
  defp option({:keypos, n}, o) when is_integer(n) and n >= 1, do: %{o | keypos: n}
  defp option({:heir, :none}, o), do: %{o | heir: :none}

  defp option({:heir, pid, data}, o) when is_pid(pid) and node(pid) == node(),
    do: %{o | heir: {pid, data}}

  # An heir without data, where the VM's ETS has one (OTP 29): it takes
  # the table without a transfer message.
  defp option({:heir, pid} = opt, o) when is_pid(pid) and node(pid) == node() do
    if Heft.VM.fact(:heir_without_data),
      do: %{o | heir: pid},
      else: raise(ArgumentError, "unknown option: #{inspect(opt)}")
  end

  defp option(:compressed, o), do: %{o | compression: :zlib}

  defp option({:compression, c}, o) when c in [:zlib, :none, :lz4, :zstd, :auto],
    do: %{o | compression: c}

  defp option({:compression, {:zstd, zo}} = opt, o) when is_list(zo),
    do: %{o | compression: {:zstd, zstd_options(zo, opt)}}

  defp option({:compression_level, l}, o) when is_integer(l) and l in 0..9,
    do: %{o | level: l}

  defp option({:arena, :memory}, o), do: %{o | arena: :memory}

  defp option({key, n}, o)
       when key in [:max_bytes, :max_records] and (is_nil(n) or (is_integer(n) and n > 0)),
       do: Map.put(o, key, n)

  defp option({:ttl, t} = opt, o) do
    unless Heft.Args.table_ttl?(t) do
      raise ArgumentError, "option :ttl has an invalid value: #{inspect(opt)}"
    end

    %{o | ttl: if(is_integer(t), do: t)}
  end

  defp option({:arena, arena} = opt, o) when elem(arena, 0) == :file do
    unless Heft.Args.arena?(arena) do
      raise ArgumentError, "option :arena has an invalid value: #{inspect(opt)}"
    end

    dir = IO.chardata_to_string(elem(arena, 1))

    unless File.dir?(dir) do
      raise ArgumentError, "option :arena: #{inspect(dir)} is not an existing directory"
    end

    %{o | arena: put_elem(arena, 1, Path.expand(dir))}
  end

  # As ETS: booleans, and :auto for :write_concurrency only.
  defp option({key, v}, o)
       when key in [:read_concurrency, :write_concurrency, :decentralized_counters] and
              (is_boolean(v) or (key == :write_concurrency and v == :auto)),
       do: o

  defp option({key, _} = opt, _o)
       when key in [
              :keypos,
              :heir,
              :compression,
              :compression_level,
              :arena,
              :max_bytes,
              :max_records,
              :read_concurrency,
              :write_concurrency,
              :decentralized_counters
            ],
       do: raise(ArgumentError, "option #{inspect(key)} has an invalid value: #{inspect(opt)}")

  defp option({:heir, _, _} = opt, _o),
    do: raise(ArgumentError, "option :heir needs a local pid, got: #{inspect(opt)}")

  defp option(opt, _o), do: raise(ArgumentError, "unknown option: #{inspect(opt)}")

  # `{:zstd, opts}`: `level: 1..22` (default 3; 9 with a dictionary), `dictionary: :none`
  # (default) or `:auto`; each at most once. Normalized to both keys, in
  # that order (what info/2 answers).
  defp zstd_options(zo, opt) do
    bad = fn why ->
      raise ArgumentError, "option :compression has an invalid value (#{why}): #{inspect(opt)}"
    end

    unless Heft.Args.proper_list?(zo), do: bad.("not a keyword list")

    Enum.reduce(zo, %{}, fn
      {k, _}, acc when is_map_key(acc, k) -> bad.("#{inspect(k)} given twice")
      {:level, l}, acc when is_integer(l) and l in 1..22 -> Map.put(acc, :level, l)
      {:level, _}, _ -> bad.("zstd's :level is an integer in 1..22")
      {:dictionary, d}, acc when d in [:none, :auto] -> Map.put(acc, :dictionary, d)
      {:dictionary, _}, _ -> bad.(":dictionary is :none or :auto")
      other, _ -> bad.("unknown zstd option #{inspect(other)}")
    end)
    |> then(fn o ->
      dict = Map.get(o, :dictionary, :none)
      [level: Map.get(o, :level, if(dict == :auto, do: 9, else: 3)), dictionary: dict]
    end)
  end

  # The NIF takes the reference of an unnamed table or the name of a
  # named one.
  defp ref(%Heft.Table{ref: ref}), do: ref
  defp ref(name) when is_atom(name), do: name

  defp ref(other),
    do: raise(ArgumentError, "not a Heft table identifier or name: #{inspect(other)}")

  @doc """
  Inserts one object or a list of objects. In a set or ordered_set an
  object replaces the one with the same key (within a list, a later object
  wins over an earlier one); a bag adds objects that match none of their
  key's, a duplicate_bag adds them all (see "Table semantics" for the
  order). A list is inserted atomically and in isolation: other processes
  see all of it or none of it.

  Returns `true`, or `{:error, reason}` if the arena cannot grow (`:enospc`
  when a file arena's disk is full; nothing is inserted and the table stays
  readable), or `{:error, :memory_budget}` if a tiered arena's memory
  budget is taken by what cannot move to its file and the write would add
  a key (in a bag, an object; see "How records are stored"; nothing is
  inserted). A persistent table may also return (see "Persistence"):

    * `{:error, :enospc}` (or another POSIX atom) - its log could not be
      written; nothing is inserted, the table stays readable.
    * `{:error, :poisoned}` - a sync of its log failed earlier; it refuses
      writes until reopened.
    * `{:error, :eio}` (from a `sync: :commit` write) - the sync of this
      write failed: the objects are in the table in memory but may not be
      on disk, and the table is now poisoned.
  """
  @spec insert(tab, object | [object]) :: true | {:error, atom}
  def insert(tab, objects) do
    ref = ref(tab)
    call(insert(ref, objects))
  end

  @doc """
  `insert/2` with per-call options:

    * `sync: :commit` returns only once the objects are on stable
      storage, whatever the table's own `:sync` mode (a persistent table
      only; the default, `sync: :table`, uses the table's mode).
    * `ttl: ms` (a non-negative integer of milliseconds) or `:infinity`:
      the objects' keys expire that long after this write, or never,
      instead of after the table's `:ttl` (see "Expiry"). The default,
      `ttl: :table`, is the table's.
  """
  @spec insert(tab, object | [object], keyword) :: true | {:error, atom}
  def insert(tab, objects, opts) do
    {sync, ttl} = write_options!(tab, opts, "Heft.insert/3")

    with true <- insert_ttl(tab, objects, ttl), :ok <- synced(tab, sync), do: true
  end

  defp insert_ttl(tab, objects, :table), do: insert(tab, objects)

  defp insert_ttl(tab, objects, ttl) do
    ref = ref(tab)
    call(insert_ttl(ref, objects, ttl))
  end

  @doc """
  Like `insert/2`, but inserts nothing and returns `false` if any key is
  already in the table.
  """
  @spec insert_new(tab, object | [object]) :: boolean | {:error, atom}
  def insert_new(tab, objects) do
    ref = ref(tab)
    call(insert_new(ref, objects))
  end

  @doc "`insert_new/2` with per-call options, as `insert/3`."
  @spec insert_new(tab, object | [object], keyword) :: boolean | {:error, atom}
  def insert_new(tab, objects, opts) do
    {sync, ttl} = write_options!(tab, opts, "Heft.insert_new/3")

    with inserted when is_boolean(inserted) <- insert_new_ttl(tab, objects, ttl),
         :ok <- synced(tab, sync),
         do: inserted
  end

  defp insert_new_ttl(tab, objects, :table), do: insert_new(tab, objects)

  defp insert_new_ttl(tab, objects, ttl) do
    ref = ref(tab)
    call(insert_new_ttl(ref, objects, ttl))
  end

  # The per-call options of insert/3 and insert_new/3, checked (a commit
  # needs a persistent table) before anything is written.
  defp write_options!(tab, opts, fun) do
    opts =
      Heft.Args.options!(opts, fun,
        sync: &(&1 in [:table, :commit]),
        ttl: &Heft.Args.write_ttl?/1
      )

    sync = Keyword.get(opts, :sync, :table)

    if sync == :commit and Native.persist_info(ref(tab)) == nil do
      raise ArgumentError, "#{fun}: sync: :commit needs a persistent table"
    end

    {sync, Keyword.get(opts, :ttl, :table)}
  end

  # After a write that was not refused: `sync: :commit` syncs the log.
  defp synced(_tab, :table), do: :ok
  defp synced(tab, :commit), do: sync(tab)

  @doc """
  Returns the objects with the key: `[object]` or `[]` in a set or
  ordered_set (where any key `==` to `key` finds it), all of the key's
  objects in a bag, in their order.
  """
  @spec lookup(tab, term) :: [object]
  def lookup(tab, key) do
    ref = ref(tab)
    call(lookup(ref, key))
  end

  @doc """
  Returns element `pos` of the object with the key; in a bag, a list of
  element `pos` of each of the key's objects. Raises `ArgumentError` if
  there is no such key, or an object has no element `pos`.
  """
  @spec lookup_element(tab, term, pos_integer) :: term
  def lookup_element(tab, key, pos) do
    ref = ref(tab)
    {element} = call(lookup_element(ref, key, pos))
    element
  end

  @doc """
  `lookup_element/3`, but returns `default` if there is no such key, as
  `:ets.lookup_element/4` (OTP 26+). Raises `ArgumentError` if `pos` is not
  a positive integer, or an object of the key has no element `pos`.
  """
  @spec lookup_element(tab, term, pos_integer, term) :: term
  def lookup_element(tab, key, pos, default) do
    unless is_integer(pos) and pos >= 1 do
      raise ArgumentError, "the position is not a positive integer: #{inspect(pos)}"
    end

    # One NIF call when the key is there; when it is not (or an object is
    # too short), the objects looked up decide, consistently.
    try do
      lookup_element(tab, key, pos)
    rescue
      e in ArgumentError ->
        case lookup(tab, key) do
          [] ->
            default

          objects ->
            unless Enum.all?(objects, &(tuple_size(&1) >= pos)), do: reraise(e, __STACKTRACE__)
            elements = Enum.map(objects, &elem(&1, pos - 1))
            if info(tab, :type) in [:bag, :duplicate_bag], do: elements, else: hd(elements)
        end
    end
  end

  @doc "True if the key is in the table."
  @spec member(tab, term) :: boolean
  def member(tab, key) do
    ref = ref(tab)
    call(member(ref, key))
  end

  @doc """
  Removes the objects with the key and returns them (as `lookup/2`). A
  persistent table may return `{:error, reason}` as `insert/2` does.
  """
  @spec take(tab, term) :: [object] | {:error, atom}
  def take(tab, key) do
    ref = ref(tab)
    call(take(ref, key))
  end

  @doc """
  Deletes the whole table. Returns `true`.

  > #### Persistent tables {: .warning}
  >
  > A persistent table is closed and **its files are removed** from its
  > directory (the directory too, if nothing else is left in it). Use
  > `close/1` to keep them. Returns `{:error, reason}` if the files could
  > not be removed.
  """
  @spec delete(tab) :: true | {:error, atom}
  def delete(tab) do
    ref = ref(tab)

    result =
      case Native.delete_table(ref) do
        :"$heft_cpu" -> Native.delete_table_cpu(ref)
        result -> result
      end

    case result do
      :"$heft_io" ->
        case Native.persist_close_io(ref, true) do
          {:error, reason} when reason not in [:poisoned] -> {:error, reason}
          _ -> true
        end

      true ->
        true
    end
  end

  @doc """
  Deletes the objects with the key, if any. Returns `true`, or (a
  persistent table) `{:error, reason}` as `insert/2` does.
  """
  @spec delete(tab, term) :: true | {:error, atom}
  def delete(tab, key) do
    ref = ref(tab)
    call(delete_key(ref, key))
  end

  @doc """
  Deletes the object if it is in the table, exactly (`=:=`; in an
  ordered_set, `{1.0, :a}` does not delete `{1, :a}`); in a duplicate_bag,
  every copy of it. Returns `true`, or (a persistent table) `{:error,
  reason}` as `insert/2` does.
  """
  @spec delete_object(tab, object) :: true | {:error, atom}
  def delete_object(tab, object) do
    ref = ref(tab)
    call(delete_object(ref, object))
  end

  @doc """
  Deletes every object; the table stays. Returns `true`, or (a persistent
  table) `{:error, reason}` as `insert/2` does.
  """
  @spec delete_all_objects(tab) :: true | {:error, atom}
  def delete_all_objects(tab) do
    ref = ref(tab)

    # The NIF answers how many objects it deleted (select_delete uses it).
    case call(delete_all_objects(ref)) do
      n when is_integer(n) -> true
      other -> other
    end
  end

  @doc """
  Atomically adds to integer elements of the object with the key, as
  `:ets.update_counter/3`: `incr` (element keypos+1), `{pos, incr}`,
  `{pos, incr, threshold, set_value}`, or a list of these (returns a list).
  Raises `ArgumentError` if the key is missing, an element is not an
  integer, `pos` is the key's or out of range, or the table is a bag. A
  persistent table may return `{:error, reason}` as `insert/2` does.
  """
  @spec update_counter(tab, term, integer | tuple | [tuple]) ::
          integer | [integer] | {:error, atom}
  def update_counter(tab, key, op) do
    ref = ref(tab)
    call(update_counter(ref, key, op, :none))
  end

  @doc """
  Like `update_counter/3`, but inserts `default` (with its key element
  replaced by `key`) first if the key is missing.
  """
  @spec update_counter(tab, term, integer | tuple | [tuple], tuple) ::
          integer | [integer] | {:error, atom}
  def update_counter(tab, key, op, default) do
    ref = ref(tab)
    default = {:default, default}
    call(update_counter(ref, key, op, default))
  end

  @doc """
  Atomically replaces elements of the object with the key: `{pos, value}`
  or a list of them. Returns `false` if the key is missing. Raises
  `ArgumentError` in a bag. A persistent table may return `{:error,
  reason}` as `insert/2` does.
  """
  @spec update_element(tab, term, {pos_integer, term} | [{pos_integer, term}]) ::
          boolean | {:error, atom}
  def update_element(tab, key, element_spec) do
    ref = ref(tab)
    call(update_element(ref, key, element_spec))
  end

  @doc """
  `update_element/3`, but if the key is missing inserts `default` (a
  tuple, its key element replaced by `key`) with the elements replaced,
  as `:ets.update_element/4` (OTP 27+). Returns `true`. Raises
  `ArgumentError` as `update_element/3` does, if `default` is not a tuple,
  and, when it is inserted, if it has no element at the keypos or at a
  position to replace (on OTP 29, as its ETS, one without an element at
  the keypos raises even when the key exists).

  Atomic as ETS's: either the object of the key was updated, or no object
  had the key and the updated default was inserted (`insert_new/2`; if
  another process inserted the key meanwhile, its object is updated).
  """
  @spec update_element(tab, term, {pos_integer, term} | [{pos_integer, term}], tuple) :: true
  def update_element(tab, key, element_spec, default) when is_tuple(default) do
    # OTP 29's ETS checks that the default holds a key even when the key
    # exists.
    if Heft.VM.fact(:update_default_checked) and tuple_size(default) < info(tab, :keypos) do
      raise ArgumentError, "update_element/4: the default #{inspect(default)} has no key element"
    end

    if update_element(tab, key, element_spec) do
      true
    else
      keypos = fitting_default!(tab, element_spec, default)
      specs = List.wrap(element_spec)

      object =
        Enum.reduce(specs, put_elem(default, keypos - 1, key), fn {p, v}, o ->
          put_elem(o, p - 1, v)
        end)

      insert_new(tab, object) or update_element(tab, key, element_spec, default)
    end
  end

  def update_element(_tab, _key, _element_spec, default),
    do: raise(ArgumentError, "update_element/4 needs a default tuple, got: #{inspect(default)}")

  # The table's keypos, once `default` is known to fit `element_spec`.
  defp fitting_default!(tab, element_spec, default) do
    keypos = info(tab, :keypos)

    fits? = fn
      {p, _} -> is_integer(p) and p >= 1 and p <= tuple_size(default) and p != keypos
      _ -> false
    end

    specs = List.wrap(element_spec)

    if tuple_size(default) < keypos or not Heft.Args.proper_list?(specs) or
         not Enum.all?(specs, fits?) do
      raise ArgumentError,
            "update_element/4: the default #{inspect(default)} does not fit #{inspect(element_spec)}"
    end

    keypos
  end

  @doc """
  The first key of a walk over the table, or `:"$end_of_table"`: the
  smallest key of an ordered_set; in other tables the order is unspecified
  but stable while the table exists.
  """
  @spec first(tab) :: term | :"$end_of_table"
  def first(tab) do
    ref = ref(tab)
    call(first(ref))
  end

  @doc """
  The key after `key` in a walk, or `:"$end_of_table"`. Works even if
  `key` has been deleted meanwhile (ETS would raise, except for an
  ordered_set): every key present for the whole walk is visited exactly
  once. In an ordered_set, the smallest key greater than `key`. Raises
  `ArgumentError` for the key `:"$end_of_table"`, as ETS does, in an
  ordered_set and in a set or bag that does not hold it.
  """
  @spec next(tab, term) :: term | :"$end_of_table"
  def next(tab, key) do
    ref = ref(tab)
    end_of_table_key!(ref, key, "next/2")
    call(next(ref, key))
  end

  # As in ETS, next/2 and prev/2 raise for the key :"$end_of_table" (what
  # a walk that has ended returns) in an ordered_set, and in a set or bag
  # unless it holds that key.
  defp end_of_table_key!(ref, :"$end_of_table" = key, fun) do
    if Native.info_map(ref).type == :ordered_set or not call(member(ref, key)) do
      raise ArgumentError, "Heft.#{fun}: the walk has ended (:\"$end_of_table\")"
    end
  end

  defp end_of_table_key!(_ref, _key, _fun), do: :ok

  @doc """
  The greatest key of an ordered_set, or `:"$end_of_table"`; in other
  tables the same as `first/1`, as in ETS.
  """
  @spec last(tab) :: term | :"$end_of_table"
  def last(tab) do
    ref = ref(tab)
    call(last(ref))
  end

  @doc """
  The greatest key smaller than `key` in an ordered_set (`key` need not be
  in the table), or `:"$end_of_table"`; in other tables the same as
  `next/2`, as in ETS. Raises for the key `:"$end_of_table"` as `next/2`
  does.
  """
  @spec prev(tab, term) :: term | :"$end_of_table"
  def prev(tab, key) do
    ref = ref(tab)
    end_of_table_key!(ref, key, "prev/2")
    call(prev(ref, key))
  end

  @doc """
  The first key of a walk with its objects, `{key, objects}`, or
  `:"$end_of_table"`, as `:ets.first_lookup/1` (OTP 27+): `first/1`
  followed by `lookup/2`; a key deleted between the two is passed over.
  """
  @spec first_lookup(tab) :: {term, [object]} | :"$end_of_table"
  def first_lookup(tab), do: with_objects(tab, first(tab), &next/2, true)

  @doc "`next/2` with the objects of the key it answers, as `:ets.next_lookup/2`."
  @spec next_lookup(tab, term) :: {term, [object]} | :"$end_of_table"
  def next_lookup(tab, key), do: with_objects(tab, next(tab, key), &next/2, false)

  @doc "`last/1` with the objects of its key, as `:ets.last_lookup/1`."
  @spec last_lookup(tab) :: {term, [object]} | :"$end_of_table"
  def last_lookup(tab), do: with_objects(tab, last(tab), &prev/2, true)

  @doc "`prev/2` with the objects of the key it answers, as `:ets.prev_lookup/2`."
  @spec prev_lookup(tab, term) :: {term, [object]} | :"$end_of_table"
  def prev_lookup(tab, key), do: with_objects(tab, prev(tab, key), &prev/2, false)

  # {key, objects} for the key a walk step answered; if it was deleted
  # since, the step after it. At the start of a walk, :"$end_of_table" may
  # be a key (as first_lookup/1 of ETS tells apart).
  defp with_objects(tab, :"$end_of_table", _step, true) do
    case lookup(tab, :"$end_of_table") do
      [] -> :"$end_of_table"
      objects -> {:"$end_of_table", objects}
    end
  end

  defp with_objects(_tab, :"$end_of_table", _step, false), do: :"$end_of_table"

  defp with_objects(tab, key, step, _start) do
    case lookup(tab, key) do
      [] -> with_objects(tab, step.(tab, key), step, false)
      objects -> {key, objects}
    end
  end

  @doc """
  Folds `fun.(object, acc)` over every object, in key order for an
  ordered_set.
  """
  @spec foldl((object, acc -> acc), acc, tab) :: acc when acc: term
  def foldl(fun, acc, tab) do
    ref = ref(tab)
    folder = Heft.Args.folder(fun, "Heft.foldl/3")
    fold_chunks(ref, :start, acc, at_end_of_table(ref, folder))
  catch
    {:heft_fold_stop, acc} -> acc
  end

  @doc """
  Folds `fun.(object, acc)` over every object from the last: in
  descending key order for an ordered_set; in other tables in the order of
  `foldl/3`, as in ETS.
  """
  @spec foldr((object, acc -> acc), acc, tab) :: acc when acc: term
  def foldr(fun, acc, tab) do
    ref = ref(tab)
    folder = Heft.Args.folder(fun, "Heft.foldr/3")
    fold_back(ref, :start, acc, at_end_of_table(ref, folder))
  catch
    {:heft_fold_stop, acc} -> acc
  end

  # What a fold does at an object whose key is :"$end_of_table" is the
  # running VM's ETS's (Heft.VM): go on, stop the walk there (OTP 26 and
  # older), or fold that key's objects and raise (OTP 27's ordered_set,
  # whose walk cannot go past that key).
  defp at_end_of_table(ref, folder) do
    rules = Heft.VM.fact(:fold_end_of_table)

    with false <- rules.hash == :visit and rules.ordered == :visit,
         {:ok, %{type: type, keypos: keypos}} <- native_info(ref) do
      at_end_of_table(
        if(type == :ordered_set, do: rules.ordered, else: rules.hash),
        keypos,
        folder
      )
    else
      # No rule to follow, or no table (the walk raises).
      _ -> folder
    end
  end

  defp at_end_of_table(:visit, _keypos, folder), do: folder

  defp at_end_of_table(rule, keypos, folder) do
    fn records, acc ->
      case Enum.split_while(records, &(elem(&1, keypos - 1) != :"$end_of_table")) do
        {_, []} ->
          folder.(records, acc)

        {before, _rest} when rule == :stop ->
          throw({:heft_fold_stop, folder.(before, acc)})

        {before, rest} ->
          {same, _} = Enum.split_while(rest, &(elem(&1, keypos - 1) == :"$end_of_table"))
          _ = folder.(before ++ same, acc)
          raise ArgumentError, "the walk cannot go past the key :\"$end_of_table\" (as in ETS)"
      end
    end
  end

  @doc "All objects, as a list (in key order for an ordered_set)."
  @spec tab2list(tab) :: [object]
  def tab2list(tab) do
    ref = ref(tab)

    ref
    |> fold_chunks(:start, [], fn records, acc -> [records | acc] end)
    |> Enum.reverse()
    |> Enum.concat()
  end

  defp fold_chunks(_ref, :"$end_of_table", acc, _fun), do: acc

  defp fold_chunks(ref, cursor, acc, fun) do
    size = @chunk
    {records, next} = call(chunk(ref, cursor, size))
    fold_chunks(ref, next, fun.(records, acc), fun)
  end

  defp fold_back(_ref, :"$end_of_table", acc, _fun), do: acc

  defp fold_back(ref, cursor, acc, fun) do
    size = @chunk
    {records, next} = call(chunk_back(ref, cursor, size))
    fold_back(ref, next, fun.(records, acc), fun)
  end

  @doc """
  A lazy stream of all objects (in key order for an ordered_set), read in
  chunks of a few hundred. Safe
  while other processes write: every object present for the whole walk is
  emitted exactly once; objects inserted or deleted meanwhile may or may
  not be.
  """
  @spec stream(tab) :: Enumerable.t()
  def stream(tab) do
    ref = ref(tab)

    Stream.resource(
      fn -> :start end,
      fn
        :"$end_of_table" ->
          {:halt, :"$end_of_table"}

        cursor ->
          size = @chunk
          call(chunk(ref, cursor, size))
      end,
      fn _ -> :ok end
    )
  end

  # --- Match specifications and patterns (lib/heft/select.ex) -------------

  @typedoc """
  A match specification, as for `:ets.select/2`: a list of
  `{head, guards, body}` clauses. `:ets.fun2ms/1` output works unchanged.
  """
  @type match_spec :: [{term, [term], [term]}]

  @typedoc "The opaque continuation of `select/3`, `match/3` and `match_object/3`."
  @type continuation :: term

  @doc """
  The results of the match specification for every object it matches, as
  `:ets.select/2`.

  The spec is compiled once and run by the VM's own matcher
  (`:ets.match_spec_run/2`) over objects decoded a chunk at a time, so
  results are ETS's and memory grows with the results, not the table.
  Before an object is decoded, a scan tests what the spec's heads and
  guards say on its stored bytes (the shape and literals of the head down
  nested tuples, repeated variables, comparisons and type tests of a head
  variable against a constant), the key first: an object that cannot
  match is neither decoded nor, when its key decides, decompressed.
  When every clause's head binds the key (a literal such as `{42, :_}`, or
  a variable pinned by a guard such as `{:"=:=", :"$1", 42}`), the objects
  are looked up by key instead of scanned. In an `:ordered_set`, a key
  bound only in part (`{{:user, :_}, :_}`: the keys that are 2-tuples
  beginning with `:user`) or bounded by guards on the key variable
  (`[{{:"$1", :_}, [{:>=, :"$1", 100}, {:<, :"$1", 200}], [:"$_"]}]`) is
  walked as a key range: the walk starts at the range's first key, found
  by binary search, and stops after its last. Results come in key order in
  an `:ordered_set`; elsewhere their order is unspecified (as in ETS).

  Raises `ArgumentError` for an invalid spec, as ETS raises `badarg`.

  ## Examples

      iex> tab = Heft.new(:sel_doc, [])
      iex> Heft.insert(tab, [{1, :a}, {2, :b}, {3, :c}])
      iex> Heft.select(tab, [{{:"$1", :"$2"}, [{:>, :"$1", 1}], [:"$2"]}]) |> Enum.sort()
      [:b, :c]
      iex> Heft.select(tab, [{{2, :"$1"}, [], [:"$1"]}])
      [:b]
  """
  @spec select(tab, match_spec) :: [term]
  def select(tab, spec), do: Heft.Select.select(ref(tab), spec)

  @doc """
  Like `select/2`, but returns at most `limit` results at a time:
  `{results, continuation}`, or `:"$end_of_table"` when there are none
  left. Pass the continuation to `select/1` for the next results. As in
  ETS, the last results come with the continuation `:"$end_of_table"` when
  the walk ends short of `limit`; a call that fills `limit` answers a
  continuation even if nothing is left (the next call answers
  `:"$end_of_table"`, or raises once the table is deleted), unless the
  spec binds its keys in its heads, which are looked up. Raises
  `ArgumentError` if `limit` is not a positive integer.
  """
  @spec select(tab, match_spec, pos_integer) :: {[term], continuation} | :"$end_of_table"
  def select(tab, spec, limit), do: Heft.Select.select_limit(ref(tab), spec, limit)

  @doc """
  Continues a `select/3` (or `match/3`, `match_object/3`,
  `select_reverse/3`): the next `{results, continuation}`, or
  `:"$end_of_table"`. Chunks are cut as ETS cuts them: an ordered_set's
  hold `limit` results (fewer at the end) and the next call reads the
  table as it is then, from the key after the last one returned; in other
  tables a chunk ends after a whole key, and the results of that key beyond
  `limit` are kept for the next call, so a bag key's objects come back in
  ETS's order (objects 1..5 of one key, two at a time: `[4, 5]`, `[2, 3]`,
  `[1]`). Objects inserted or deleted between calls may or may not be
  seen; every object present throughout is seen once. Raises
  `ArgumentError` if the table no longer exists.
  """
  @spec select(continuation) :: {[term], continuation} | :"$end_of_table"
  def select(continuation), do: Heft.Select.continue(continuation)

  @doc """
  As `select/2`, in descending key order in an `:ordered_set` (walking key
  ranges backward too). Other table types have no key order, so this is
  `select/2` there, as in ETS.
  """
  @spec select_reverse(tab, match_spec) :: [term]
  def select_reverse(tab, spec), do: Heft.Select.select(ref(tab), spec, :backward)

  @doc "As `select/3`, in reverse order where the table has one (see `select_reverse/2`)."
  @spec select_reverse(tab, match_spec, pos_integer) ::
          {[term], continuation} | :"$end_of_table"
  def select_reverse(tab, spec, limit),
    do: Heft.Select.select_limit(ref(tab), spec, limit, :backward)

  @doc "Continues a `select_reverse/3`; see `select/1`."
  @spec select_reverse(continuation) :: {[term], continuation} | :"$end_of_table"
  def select_reverse(continuation), do: select(continuation)

  @doc """
  The number of objects for which the match specification returns `true`.
  A spec whose first clause matches everything and returns `true`
  (`[{:_, [], [true]}]`) is answered from the table's size. When every
  clause returns `true` and its head and guards are made only of what a
  scan tests on stored bytes (see `select/2`: tuples, scalar literals,
  variables, `andalso`, comparisons with constants, type tests), objects
  are counted without being decoded; the VM's matcher still decides those
  the bytes cannot (float zeros, big integers, compounds).
  """
  @spec select_count(tab, match_spec) :: non_neg_integer
  def select_count(tab, spec), do: Heft.Select.select_count(ref(tab), spec)

  @doc """
  Deletes every object for which the match specification returns `true`
  and returns how many it deleted. Each object is deleted only if it is
  still exactly the object the spec saw (an object another process changed
  meanwhile is kept), so concurrent writers are never undone. Exactly
  means bit for bit, as ETS deletes the very object its matcher saw: in a
  bag, `{:k, 0.0}` and `{:k, -0.0}` are told apart even on OTP 26 and
  older, where `delete_object/2` takes them for one.

  Specs that look only at an object's shape go faster, without decoding
  objects: one whose first clause matches everything and returns `true`
  (`[{:_, [], [true]}]`) empties the table in one step, as
  `delete_all_objects/1`; `[{{:_, :_}, [], [true]}]` (any tuple of `:_`
  and distinct variables, the spec of `match_delete(t, {:_, :_})`)
  deletes the objects of that arity in chunks. Objects inserted while it
  runs may or may not be deleted, as in ETS.

  Returns `{:error, reason}` if a write is refused (a persistent table's
  log, or a file arena's full disk: `:enospc`); objects deleted before
  that stay deleted.
  """
  @spec select_delete(tab, match_spec) :: non_neg_integer | {:error, atom}
  def select_delete(tab, spec), do: Heft.Select.select_delete(ref(tab), spec)

  @doc """
  Replaces every object the match specification matches with the spec's
  result and returns how many it replaced. Each replacement is atomic: it
  happens only if the object is still the one the spec saw; an object
  changed meanwhile is read again and the spec run on its new value. A
  result that differs from its object only in the sign of a zero is
  written, as in ETS.

  As in ETS, the spec must provably keep each object's key: every clause's
  body is `[:"$_"]`, or a single tuple construction (`{{...}}`) or
  constant (`{:const, tuple}`) whose key element is the head's key
  variable or literal (or `{:element, keypos, :"$_"}`). Otherwise raises
  `ArgumentError` and replaces nothing. A `:bag` table raises
  `ArgumentError`, as in ETS.

  Returns `{:error, reason}` if a write is refused, as `select_delete/2`.
  """
  @spec select_replace(tab, match_spec) :: non_neg_integer | {:error, atom}
  def select_replace(tab, spec), do: Heft.Select.select_replace(ref(tab), spec)

  @doc """
  The bindings of the pattern's variables (`:"$1"`, `:"$2"`...) for each
  matching object, as `:ets.match/2`: a list of lists, each in variable
  number order. `:_` matches anything.
  """
  @spec match(tab, term) :: [[term]]
  def match(tab, pattern), do: select(tab, Heft.MatchSpec.of_pattern(pattern, :bindings))

  @doc "As `match/2`, `limit` at a time (see `select/3`); continue with `match/1`."
  @spec match(tab, term, pos_integer) :: {[[term]], continuation} | :"$end_of_table"
  def match(tab, pattern, limit),
    do: select(tab, Heft.MatchSpec.of_pattern(pattern, :bindings), limit)

  @doc "Continues a `match/3`; see `select/1`."
  @spec match(continuation) :: {[[term]], continuation} | :"$end_of_table"
  def match(continuation), do: select(continuation)

  @doc "Every object that matches the pattern, as `:ets.match_object/2`."
  @spec match_object(tab, term) :: [object]
  def match_object(tab, pattern), do: select(tab, Heft.MatchSpec.of_pattern(pattern, :object))

  @doc "As `match_object/2`, `limit` at a time; continue with `match_object/1`."
  @spec match_object(tab, term, pos_integer) :: {[object], continuation} | :"$end_of_table"
  def match_object(tab, pattern, limit),
    do: select(tab, Heft.MatchSpec.of_pattern(pattern, :object), limit)

  @doc "Continues a `match_object/3`; see `select/1`."
  @spec match_object(continuation) :: {[object], continuation} | :"$end_of_table"
  def match_object(continuation), do: select(continuation)

  @doc """
  Deletes every object that matches the pattern (each only if unchanged,
  as `select_delete/2`). Returns `true`, or `{:error, reason}` as
  `select_delete/2`.
  """
  @spec match_delete(tab, term) :: true | {:error, atom}
  def match_delete(tab, pattern) do
    case select_delete(tab, Heft.MatchSpec.of_pattern(pattern, true)) do
      {:error, _} = error -> error
      _count -> true
    end
  end

  # --- end of match specifications ----------------------------------------

  # --- Table files (lib/heft/tab_file.ex, format in docs/tab-file.md) ------

  @doc """
  Writes the table to `filename`: its options (name, type, keypos,
  protection, compression, whether it is named) and every object, in the
  checksummed format of docs/tab-file.md. The file is written beside its
  destination, under a random name, created exclusively and never through
  a symbolic link, and renamed over `filename` when complete (a link at
  `filename` is replaced, not written through), so `filename` never holds
  half a table. It is created with mode 0600, whatever the umask
  (`:ets.tab2file/2` gives 0666 minus the umask): chmod it to share it.

  Options:

    * `sync: boolean` - fsync the file before renaming it, and its
      directory after (default `false`).
    * `extended_info: list` - accepted for compatibility with
      `:ets.tab2file/3` and ignored: every file has checksums and an object
      count.
    * `format: :ets` - write ETS's format instead (what `:ets.tab2file/3`
      writes: a `disk_log` of the table's options and objects, with an
      object count and an MD5 digest if `extended_info` asks for
      `:object_count` and `:md5sum`), for `:ets.file2tab/1,2` and
      `:ets.tabfile_info/1` to read. The header's options are what
      `info/2` answers. The file is made by `disk_log` in a new
      directory of mode 0700 beside `filename` and renamed over it; its
      mode is `disk_log`'s (0666 minus the umask). Default `:heft`.

  Objects are read in chunks while other processes may write: the file
  holds every object present throughout the call. Objects are stored as
  terms, with the table's options and its zstd dictionaries, so that
  `file2tab/2` makes a table of the same compression that uses them from
  the start.

  Returns `:ok`, or `{:error, reason}` with a POSIX reason (`:enoent` when
  the directory does not exist, `:eacces`, `:enospc`...). Raises
  `ArgumentError` if the table does not exist or the caller may not read
  it, or for an unknown option.
  """
  @spec tab2file(tab, Path.t(), keyword) :: :ok | {:error, File.posix()}
  def tab2file(tab, filename, opts \\ []) do
    ref = ref(tab)
    filename = Heft.Args.filename!(filename, "Heft.tab2file/3")

    opts =
      Heft.Args.options!(opts, "Heft.tab2file/3",
        sync: &is_boolean/1,
        extended_info: &Heft.Args.proper_list?/1,
        format: &(&1 in [:heft, :ets])
      )

    case Keyword.get(opts, :format, :heft) do
      :heft ->
        Heft.TabFile.write(ref, filename, opts)

      :ets ->
        extended = Keyword.get(opts, :extended_info, [])

        unless Enum.all?(extended, &(&1 in [:object_count, :md5sum])) do
          raise ArgumentError,
                "Heft.tab2file/3: extended_info takes :object_count and :md5sum, got: " <>
                  inspect(extended)
        end

        Heft.EtsTabFile.write(tab, filename, opts)
    end
  end

  @doc """
  Reads a table written by `tab2file/3`, or by ETS's `:ets.tab2file/2,3`,
  and creates it again, owned by the caller, with its stored options.
  Returns `{:ok, tab}` (the name for a named table), or `{:error, reason}`
  without creating anything:

    * a POSIX atom (`:enoent`, `:eacces`, `:eisdir`...) - the file cannot
      be read.
    * `:badfile` - not a Heft table file (empty, or no magic).
    * `{:unsupported_version, v}` - written by a newer format.
    * `{:truncated, offset}` - the file ends early, inside the frame that
      starts at byte `offset` or before the end frame.
    * `{:corrupt, offset}` - the frame at byte `offset` fails its checksum
      or is malformed.
    * `:cannot_create_table` - a named table of the stored name exists.
    * `{:unsupported_object, offset}` - the frame at byte `offset` holds an
      object Heft cannot store (maps nested more than 64 deep in a key or
      a bag's object).

  Options: `arena: :memory | {:file, dir}` for the new table (default
  `:memory`, as for `new/2`); `verify: boolean` (default `false`) checks
  a file of ETS's as `:ets.file2tab/2` does, and is ignored for Heft's
  files, whose every frame is always verified.

  A file of ETS's (a `disk_log` of terms: the table's options, its objects,
  and with `extended_info` an object count and an MD5 digest) gives the
  new table its name, type, keypos, protection and whether it is named,
  with Heft's default compression. Its errors are ETS's: `:badfile` (no
  header with the table's options, or with `verify: true` damaged bytes
  or a missing count or digest the header promised),
  `{:read_error, reason}` (`disk_log` could not open it),
  `{:unsupported_file_version, {major, minor}}`, `:cannot_create_table`,
  and with `verify: true`, `:invalid_object_count` and `:checksum_error`.
  Without `verify: true` a damaged term is skipped, as ETS does.
  """
  @spec file2tab(Path.t(), keyword) :: {:ok, tab} | {:error, Heft.TabFile.reason() | term}
  def file2tab(filename, opts \\ []) do
    filename = Heft.Args.filename!(filename, "Heft.file2tab/2")

    opts =
      Heft.Args.options!(opts, "Heft.file2tab/2",
        verify: &is_boolean/1,
        arena: &Heft.Args.arena?/1
      )

    Heft.TabFile.read(filename, opts)
  end

  # --- end of table files ---------------------------------------------------

  # --- ETS's remaining calls: fixation, slots, bulk loading, dets, i/0 ------

  @doc """
  Fixes (`true`) or releases (`false`) the table for the calling process,
  as `:ets.safe_fixtable/2`. A process may fix a table several times; it
  stays fixed until each fixation is released, or the process exits.
  Releasing a table the caller has not fixed does nothing. Returns `true`.

  ETS's guarantee holds: on a fixed table, a `first/1`-`next/2` walk
  visits every object present for the whole walk exactly once, however
  other processes insert and delete meanwhile, and `next/2` of a key
  deleted since still works. In Heft this holds on any table, fixed or
  not (see "Differences from ETS"). Fixing changes what `info/2` reports
  (`:fixed`, `:safe_fixed` and `:safe_fixed_monotonic_time`) and keeps a
  set's or bag's `slot/2` numbering as it was when the table became fixed,
  so that a slot walk too sees every object once.

  Raises `ArgumentError` if `fix` is not a boolean, the table does not
  exist, or it is private and the caller is not its owner.
  """
  @spec safe_fixtable(tab, boolean) :: true
  def safe_fixtable(tab, fix) when is_boolean(fix) do
    ref = ref(tab)
    now = :erlang.monotonic_time()

    case Native.safe_fixtable(ref, fix, now) do
      :"$heft_cpu" -> Native.safe_fixtable_cpu(ref, fix, now)
      true -> true
    end
  end

  def safe_fixtable(_tab, fix),
    do: raise(ArgumentError, "safe_fixtable/2 needs a boolean, got: #{inspect(fix)}")

  @doc """
  The objects in slot `i` of the table (a list, maybe empty), or
  `:"$end_of_table"` when `i` is the number of slots, as `:ets.slot/2`:
  reading slots 0, 1, 2... until `:"$end_of_table"` returns every object
  exactly once if the table does not change meanwhile.

  What a slot is:

    * set, bag, duplicate_bag: slot `i` is bucket `i` of the hash index
      (2^k buckets, at least 16, between 1.25 and 8 a key): the objects
      whose key hash begins with the k bits of `i`, all of a bag key's
      objects together in their order. The number of buckets changes as
      the table grows or shrinks, so a slot walk while others write may
      miss or repeat objects, unless the table is fixed
      (`safe_fixtable/2`), as in ETS: a fixed table keeps the slots it had
      when it became fixed, however its index grows or shrinks, and a slot
      walk then sees every object present throughout exactly once and no
      object twice.
    * ordered_set: slot `i` is the `i`-th object in key order (from 0), as
      in ETS.

  Raises `ArgumentError` if `i` is not a non-negative integer or is
  greater than the number of slots, or if the table does not exist or the
  caller may not read it.
  """
  @spec slot(tab, non_neg_integer) :: [object] | :"$end_of_table"
  def slot(tab, i) when is_integer(i) and i >= 0 do
    ref = ref(tab)
    call(slot(ref, i))
  end

  def slot(_tab, i),
    do: raise(ArgumentError, "slot/2 needs a non-negative integer, got: #{inspect(i)}")

  @doc """
  Replaces the table's objects with those `init_fun` supplies, as
  `:ets.init_table/2`: deletes every object, then calls `init_fun.(:read)`,
  which returns `{objects, next_fun}` (inserted, and then
  `next_fun.(:read)` is called) or `:end_of_input`. If inserting fails, the
  last fun returned is called with `:close` and the error raised again.
  Returns `true`.

  The objects of each list go in as one `insert/2` (in a bag, in the list's
  order, as if inserted one by one). The whole is not atomic, as in ETS:
  other processes may see the table emptied and filling up, and an error
  leaves the objects inserted before it.

  Raises `ArgumentError`, before deleting anything, if `init_fun` is not a
  function of one argument or the caller may not write the table; and
  after, if a fun returns anything else or an object does not fit the
  table. Returns `{:error, reason}` as `insert/2` does (a persistent
  table's log), after calling `:close`.
  """
  @spec init_table(tab, (:read | :close -> term)) :: true | {:error, atom}
  def init_table(tab, init_fun) when is_function(init_fun, 1) do
    ref = ref(tab)
    _ = Native.select_access(ref, true)

    case delete_all_objects(tab) do
      {:error, _} = error -> error
      true -> init_from(tab, init_fun.(:read))
    end
  end

  def init_table(_tab, init_fun),
    do:
      raise(ArgumentError, "init_table/2 needs a function of arity 1, got: #{inspect(init_fun)}")

  defp init_from(_tab, :end_of_input), do: true

  defp init_from(tab, {objects, next_fun}) when is_list(objects) and is_function(next_fun, 1) do
    inserted =
      try do
        insert_in_order(tab, objects)
      rescue
        e in ArgumentError ->
          close_init(next_fun)
          reraise e, __STACKTRACE__
      end

    case inserted do
      {:error, _} = error ->
        close_init(next_fun)
        error

      true ->
        init_from(tab, next_fun.(:read))
    end
  end

  defp init_from(_tab, other) do
    raise ArgumentError,
          "init_table/2: the fun must return {objects, fun} or :end_of_input, got: " <>
            inspect(other, limit: 8)
  end

  defp close_init(fun) do
    fun.(:close)
  catch
    _, _ -> :ok
  end

  # Inserts `objects` as if one at a time: where a bag takes one insert/2
  # list last to first (OTP 26 and older, see "Table semantics"), it gets
  # the list reversed.
  defp insert_in_order(tab, objects) do
    if Heft.VM.fact(:bag_batch_reversed) and info(tab, :type) == :bag,
      do: insert(tab, Enum.reverse(objects)),
      else: insert(tab, objects)
  end

  @doc """
  Restores a continuation of `select/3` (or `select/1`, `match/3`...) whose
  compiled match specification did not survive a trip through the external
  term format (another node, a file), as `:ets.repair_continuation/2`:
  compiles `match_spec` (the spec of the original call) into it again. A
  continuation that needs no repair, and `:"$end_of_table"`, come back
  unchanged. (`select/1` repairs a continuation itself too, from the spec
  it carries.)

  Raises `ArgumentError` if `continuation` is not a Heft continuation or
  `match_spec` is not a valid match specification.
  """
  @spec repair_continuation(continuation | :"$end_of_table", match_spec) ::
          continuation | :"$end_of_table"
  def repair_continuation(continuation, match_spec),
    do: Heft.Select.repair(continuation, match_spec)

  @doc """
  Fills the open `:dets` table `dets_tab` with the table's objects, as
  `:ets.to_dets/2`: the dets table is emptied first. Returns `dets_tab`.

  Objects are read in chunks while other processes may write: the dets
  table gets every object present for the whole call.

  Raises `ArgumentError` if the table does not exist or the caller may not
  read it, or `dets_tab` is not an open dets table or refuses an object
  (a keypos beyond an object, say); raises `Heft.Error` with dets's reason
  if dets fails otherwise (disk full...).
  """
  @spec to_dets(tab, :dets.tab_name()) :: :dets.tab_name()
  def to_dets(tab, dets_tab) do
    ref = ref(tab)
    _ = Native.select_access(ref, false)
    open_dets!(dets_tab, "to_dets/2")
    _ = dets!(fn -> :dets.delete_all_objects(dets_tab) end, dets_tab, "empty")
    to_dets(ref, dets_tab, :start)
  end

  defp to_dets(_ref, dets_tab, :"$end_of_table"), do: dets_tab

  defp to_dets(ref, dets_tab, cursor) do
    size = @chunk
    {objects, next} = call(chunk(ref, cursor, size))
    _ = dets!(fn -> :dets.insert(dets_tab, objects) end, dets_tab, "write")
    to_dets(ref, dets_tab, next)
  end

  @doc """
  Inserts the objects of the open `:dets` table `dets_tab` into the table,
  as `:ets.from_dets/2`: objects already in the table stay unless
  replaced. Returns `true`.

  Raises `ArgumentError` if the table does not exist or the caller may not
  write it, if an object does not fit it, or if `dets_tab` is not an open
  dets table; raises `Heft.Error` with dets's reason if reading the dets
  table fails. Returns `{:error, reason}` as `insert/2` does.
  """
  @spec from_dets(tab, :dets.tab_name()) :: true | {:error, atom}
  def from_dets(tab, dets_tab) do
    ref = ref(tab)
    _ = Native.select_access(ref, true)
    open_dets!(dets_tab, "from_dets/2")
    first = fn -> :dets.select(dets_tab, [{:_, [], [:"$_"]}], @chunk) end
    from_dets_chunks(tab, dets_tab, dets!(first, dets_tab, "read"))
  end

  defp from_dets_chunks(_tab, _dets_tab, :"$end_of_table"), do: true

  defp from_dets_chunks(tab, dets_tab, {objects, cont}) do
    case insert_in_order(tab, objects) do
      {:error, _} = error ->
        error

      true ->
        from_dets_chunks(tab, dets_tab, dets!(fn -> :dets.select(cont) end, dets_tab, "read"))
    end
  end

  defp open_dets!(dets_tab, fun) do
    if :dets.info(dets_tab, :type) == :undefined do
      raise ArgumentError, "#{fun}: #{inspect(dets_tab)} is not an open dets table"
    end
  end

  # Runs a dets call: its answer, or ArgumentError when dets refuses the
  # objects (badarg), or Heft.Error with dets's reason when it fails.
  defp dets!(call, dets_tab, action) do
    case call.() do
      {:error, reason} ->
        raise Heft.Error, reason: reason, action: "#{action} the dets table #{inspect(dets_tab)}"

      result ->
        result
    end
  rescue
    ArgumentError ->
      reraise ArgumentError,
              [message: "the dets table #{inspect(dets_tab)} refused to #{action} the objects"],
              __STACKTRACE__
  end

  @doc """
  What a file written by `tab2file/3` holds, without loading it, as
  `:ets.tabfile_info/1`: `{:ok, info}` with the keys `:name`, `:type`,
  `:protection`, `:named_table`, `:keypos`, `:size` (the object count, from
  the file's end frame), `:extended_info` (`[:object_count]`: every Heft
  file carries its count and CRC-32 checksums, never ETS's md5sum) and
  `:version` (`{format_version, 0}`, docs/tab-file.md).

  Reads the head, the meta frame and the end frame only (each checked);
  `file2tab/2` verifies the rest. Returns `{:error, reason}` with the
  reasons of `file2tab/2`: a POSIX atom, `:badfile`,
  `{:unsupported_version, v}`, `{:truncated, offset}`, `{:corrupt, offset}`.

  For a file of ETS's `:ets.tab2file/2,3`, answers what
  `:ets.tabfile_info/1` does: its header's items (`:size` as the table had
  it, `:extended_info` as written) and `:version`, or `:badfile` or
  `{:read_error, reason}`.
  """
  @spec tabfile_info(Path.t()) :: {:ok, keyword} | {:error, Heft.TabFile.reason() | term}
  def tabfile_info(filename) do
    unless is_binary(filename) or is_list(filename) or is_atom(filename) do
      raise ArgumentError, "tabfile_info/1 needs a file name, got: #{inspect(filename)}"
    end

    Heft.TabFile.info(filename)
  end

  @doc """
  Prints one line about every Heft table of the node to standard output,
  as `:ets.i/0` does for ETS tables: identifier, name, type, size (objects),
  memory in **bytes** (`info(tab, :memory)`) and owner (its registered
  name if it has one). Returns `:ok`.
  """
  @spec i() :: :ok
  def i do
    i_line("id", "name", "type", "size", "bytes", "owner")
    IO.puts(" " <> String.duplicate("-", 76))

    for tab <- Enum.sort(all()) do
      with {:ok, ref} <- safe_ref(tab), {:ok, info} <- native_info(ref) do
        owner =
          case Process.info(info.owner, :registered_name) do
            {:registered_name, name} when is_atom(name) -> name
            _ -> info.owner
          end

        i_line(tab, info.name, info.type, info.size, info.memory, owner)
      end
    end

    :ok
  end

  @doc """
  Browses the table's objects on standard input and output, as
  `:ets.i/1`: 39 objects a page, each numbered and cut to 80 columns
  (printed with `inspect/1`), then a prompt. Commands: `c` (or an empty
  line) shows the next page, `q` quits, `k` deletes the table, `p` and a
  number prints that object in full, `/` and a regular expression shows
  only the objects whose printed form matches it, from the first. Returns
  `:ok`.
  """
  @spec i(tab) :: :ok
  def i(tab) do
    _ = ref(tab)
    Heft.Browse.i(tab)
  end

  defp i_line(id, name, type, size, bytes, owner) do
    [id, name, type, size, bytes, owner] =
      Enum.map(
        [id, name, type, size, bytes, owner],
        &if(is_binary(&1), do: &1, else: inspect(&1))
      )

    cols =
      Enum.zip_with([id, name, type, size, bytes], [15, 17, 5, 6, 10], &String.pad_trailing/2)

    IO.puts(" " <> Enum.join(cols ++ [owner], " "))
  end

  # --- end of ETS's remaining calls -------------------------------------------

  # The items ETS's info/1 gives, in its order; Heft's follow them.
  @ets_info_items [
    :id,
    :name,
    :named_table,
    :type,
    :keypos,
    :protection,
    :owner,
    :heir,
    :node,
    :compressed,
    :read_concurrency,
    :write_concurrency,
    :decentralized_counters,
    :size,
    :memory
  ]
  @info_order @ets_info_items ++
                [
                  :compression,
                  :arena,
                  :index_bytes,
                  :meta_bytes,
                  :arena_mapped_bytes,
                  :arena_used_bytes,
                  :arena_live_bytes,
                  :arena_free_bytes,
                  :arena_reclaimable_bytes,
                  :arena_resident_bytes,
                  :arena_dirty_bytes,
                  :arena_swap_bytes,
                  :index_resident_bytes,
                  :payload_raw_bytes,
                  :payload_stored_bytes,
                  :dictionary_bytes,
                  :dictionaries,
                  :records_by_codec,
                  :recompression,
                  :training,
                  :compaction,
                  :budget,
                  :expiry,
                  :tier
                ]
  @kernel_items [
    :arena_resident_bytes,
    :arena_dirty_bytes,
    :arena_swap_bytes,
    :index_resident_bytes
  ]

  @doc false
  # ETS's info/1 items (Heft.EtsTabFile writes them into ETS's tab file).
  def __ets_info_items__, do: @ets_info_items

  @doc """
  Facts and figures about the table as a keyword list, or `:undefined` if
  it does not exist. Every size is in **bytes** (ETS reports words):

    * `:size` - objects in the table.
    * `:memory` - what the table holds: `:index_bytes + :meta_bytes +
      :arena_used_bytes`. Not counted: the arena's pages the kernel
      has not been asked for (mapped but never touched), and the allocator's
      own bookkeeping.
    * `:index_bytes` - the key index, exactly. For a set or bag, its slot
      array: its own mapping (`[anon:heft-index:<name>]` in
      /proc/self/maps, on 2 MiB pages where the kernel allows, or
      `/memfd:heft-index:<name>` where it cannot name anonymous memory),
      8 bytes a slot (an object) and a byte per 64 slots, kept at most 80%
      full and growing by half (10 to 15 bytes an object), rounded up to
      whole pages. It shrinks
      once it is under an eighth full and has lost half of its objects
      since it last changed size, unless the survivors sit crowded in one
      part of the hash space (after deleting in walk order, as a
      `first/1`-then-`delete/2` loop does): then it keeps its size, as
      halving it would make every operation there a scan, until its keys
      spread out again or it empties. For an ordered_set, its 4 KiB pages
      of 256 sorted entries, each a record handle and an 8-byte prefix of
      its key that keeps term order, so that a search reads keys only on
      prefix ties (a memfd mapping of the same name; pages in use only, at
      least a quarter full, about 70% after random inserts: some 22 bytes a
      key) plus its directory of 24 bytes a page (heap capacity).
    * `:meta_bytes` - the atom dictionary (estimated from capacities), the
      arena's free lists (Rust heap memory) and `:dictionary_bytes`.
    * `:arena_mapped_bytes` - length of the arena mapping
      (anonymous memory, `/memfd:heft:<name>` or the arena file;
      address space, pages are only allocated when touched: on huge pages,
      2 MiB at a time).
    * `:arena_used_bytes` - arena space handed out: blocks holding objects,
      freed blocks waiting for reuse, and an 8-byte head; whole pages of
      freed large blocks that were given back to the kernel are left out.
    * `:arena_live_bytes` - blocks holding objects, size-class slack (at
      most 12.5%) included.
    * `:arena_free_bytes` - freed blocks waiting for reuse: by a record
      of their size class or a little smaller, or, cut, by a smaller one;
      blocks freed one after another that border each other are merged
      as they are freed (docs/term-format.md, "Records in the arena").
      Other free neighbours are merged, and the top of the arena given
      back, by a compaction (see `compact/1`); until then only whole
      pages of freed large blocks go back to the kernel.
    * `:arena_reclaimable_bytes` - the part of `:arena_free_bytes` still
      in memory (for a file arena, on disk): what a compaction could give
      back.
    * `:arena_resident_bytes`, `:arena_dirty_bytes`, `:arena_swap_bytes` -
      the kernel's view of the arena mapping, from /proc/self/smaps: pages
      in RAM, pages modified and not written back (for a memory arena, all
      resident pages: they are never written back, only swapped), pages in
      swap. On huge pages resident memory grows in 2 MiB steps, so it may
      exceed `:arena_used_bytes` by up to 2 MiB. A file arena's resident
      bytes are its pages in RAM whether this process maps them now or
      not (mincore(2): the page cache holds pages smaps no longer
      counts once the table outgrows memory). A tiered arena's count both
      its memory's mapping and its file (resident: the file's pages in
      RAM, as for a file arena).
    * `:index_resident_bytes` - the kernel's view of the index mapping:
      pages in RAM.
    * `:payload_raw_bytes` - sum over objects of their encoded key and
      body before compression.
    * `:payload_stored_bytes` - the same as stored: headers, keys and
      (compressed) bodies, without size-class slack.
    * `:compression` - as `new/2` takes it, completed: `:none`,
      `{:zlib, level}`, `:lz4`, `{:zstd, [level: l, dictionary: :none |
      :auto]}`, or for `compression: :auto` `{:auto, c}` with `c` the
      codec new writes use (zstd until the table has chosen; see
      "Compression"). `:arena` - `:memory`, `{:file, path}` or `{:file,
      path, memory: bytes}`.
    * `:dictionary_bytes` - memory the table's zstd dictionaries take
      (their bytes and zstd's digests of them; counted in `:meta_bytes`
      and so in `:memory`).
    * `:dictionaries` - one map a dictionary, oldest first: `%{id: id,
      bytes: trained_bytes, records: records_compressed_with_it,
      current: new_writes_use_it?}`.
    * `:records_by_codec` - records stored by each codec: `%{raw: n,
      zlib: n, zstd: n, lz4: n, zstd_dict: n}` (`:raw`: stored as
      encoded, where compressing did not pay).
    * `:recompression` - the background re-compression after a
      dictionary or codec change: `%{state: s, done: visited, total:
      records, recompressed: stored_again}`, `s` one of `:idle`,
      `:sampling`, `:training`, `:running`, `:done`, `:failed`.
    * `:training` - the last training: `%{samples: n, sample_bytes: b,
      dictionary_bytes: d, microseconds: us, trials: [...], error: nil |
      reason}`; for `compression: :auto`, `:trials` lists what each codec
      did on the samples: `%{compression: c, bytes: stored, decode_ns:
      per_record}`.
    * `:tier` - `nil` but for a tiered arena (`arena: {:file, dir,
      memory: bytes}`): `%{memory_budget: bytes, memory_used_bytes: u,
      memory_live_bytes: l, file_used_bytes: fu, file_live_bytes: fl,
      moved_records: r, moved_bytes: m, queue_bytes: q, file_reads: fr,
      file_read_bytes: frb}` - the budget, the arena bytes handed out and
      those holding records in memory and in the file (the `:arena_*`
      items count both), the records and bytes moved out (written) to the
      file so far, the queue of keys in memory (counted in
      `:meta_bytes`), and the records lookups (`lookup/2` and its kin that
      copy objects out) found in the file and their bytes: what lookups
      read from the file, from the page cache or from disk.
    * `:compaction` - the table's compactions so far (see `compact/1`):
      `%{state: :idle | :running, runs: n, moved_records: r, moved_bytes:
      m, returned_bytes: b, longest_lock_hold_us: us}`, totals over every
      run (those that found nothing worth moving included; `us` the
      longest of any).

  And as in ETS: `:id` (the table's `Heft.Table` identifier, also for a
  named table), `:name`, `:named_table`, `:type`, `:keypos`,
  `:protection`, `:owner`, `:heir` (`:none` once the heir has exited),
  `:node`, and what is true of every Heft table for ETS's tuning items:

    * `:compressed` - `true` unless the table was created with
      `compression: :none` (records are deflated where that pays).
    * `:read_concurrency` - `true`: readers share the table's lock and
      never block each other, whatever was asked for.
    * `:write_concurrency` - `false`: writers take the table's one write
      lock in turn (they encode and compress before taking it).
    * `:decentralized_counters` - `false`: the size is one counter.
  """
  @spec info(tab) :: keyword | :undefined
  def info(tab) do
    with {:ok, ref} <- safe_ref(tab),
         {:ok, map} <- native_info(ref),
         {:ok, kernel} <- kernel_view(ref) do
      map = Map.merge(map, kernel)
      Enum.map(@info_order, &{&1, Map.fetch!(map, &1)}) ++ persist_info(ref)
    else
      _ -> :undefined
    end
  end

  defp persist_info(ref) do
    Heft.Persist.info(ref)
  rescue
    ArgumentError -> []
  end

  @doc """
  One item of `info/1`, or `:undefined` if the table does not exist
  (whatever the item, as in ETS). Raises `ArgumentError` for an unknown
  item of a table that exists.

  Also, as in ETS, what `safe_fixtable/2` did:

    * `:fixed` - whether any process has the table fixed.
    * `:safe_fixed` - `false`, or `{fixation_time, [{pid, count}]}`: when
      the table became fixed (in `:erlang.timestamp/0` form) and each
      process that has it fixed with the number of its fixations, the
      first fixer first.
    * `:safe_fixed_monotonic_time` - the same with the time as
      `:erlang.monotonic_time/0` (native units).

  And `:binary`, ETS's list of the reference-counted binaries the table
  holds: always `[]`, since Heft copies every binary into its arena.
  """
  @spec info(tab, atom) :: term | :undefined
  def info(tab, item) when item in @info_order do
    with {:ok, ref} <- safe_ref(tab),
         {:ok, map} <- native_info(ref),
         {:ok, map} <- if(item in @kernel_items, do: kernel_view(ref), else: {:ok, map}) do
      Map.fetch!(map, item)
    else
      _ -> :undefined
    end
  end

  @persist_items Heft.Persist.items()

  def info(tab, item) when item in @persist_items do
    {:ok, ref} = safe_ref(tab)
    Heft.Persist.info(ref, item)
  rescue
    ArgumentError -> :undefined
  end

  def info(tab, item) when item in [:fixed, :safe_fixed, :safe_fixed_monotonic_time] do
    with {:ok, ref} <- safe_ref(tab),
         {:ok, fixed} <- fixations(ref) do
      case {item, fixed} do
        {:fixed, fixed} -> fixed != false
        {_, false} -> false
        {:safe_fixed_monotonic_time, fixed} -> fixed
        {:safe_fixed, {since, procs}} -> {timestamp(since), procs}
      end
    else
      _ -> :undefined
    end
  end

  def info(tab, item) do
    with {:ok, ref} <- safe_ref(tab), {:ok, _} <- native_info(ref) do
      if item == :binary,
        do: [],
        else: raise(ArgumentError, "unknown info item: #{inspect(item)}")
    else
      _ -> :undefined
    end
  end

  defp fixations(ref) do
    {:ok, Native.fixations(ref)}
  rescue
    ArgumentError -> :error
  end

  # A monotonic time (native units) in :erlang.timestamp/0 form.
  defp timestamp(monotonic) do
    us = :erlang.convert_time_unit(monotonic + :erlang.time_offset(), :native, :microsecond)
    {div(us, 1_000_000_000_000), rem(div(us, 1_000_000), 1_000_000), rem(us, 1_000_000)}
  end

  # info/1,2 answer :undefined for a table that no longer exists, and raise
  # for what cannot name a table at all, as ETS does.
  defp safe_ref(%Heft.Table{ref: ref}), do: {:ok, ref}
  defp safe_ref(name) when is_atom(name), do: {:ok, name}

  defp safe_ref(other),
    do: raise(ArgumentError, "not a Heft table identifier or name: #{inspect(other)}")

  defp native_info(ref) do
    map = Native.info_map(ref)

    {:ok,
     Map.merge(map, %{
       node: node(),
       memory: map.index_bytes + map.meta_bytes + map.arena_used_bytes,
       compression: __compression_shape__(map.compression),
       training:
         Map.update!(
           map.training,
           :trials,
           &Enum.map(&1, fn t -> %{t | compression: __compression_shape__(t.compression)} end)
         ),
       compressed: map.compression != :none,
       read_concurrency: true,
       write_concurrency: false,
       decentralized_counters: false
     })}
  rescue
    ArgumentError -> :error
  end

  @doc false
  # The NIF's compression as Heft.new/2 takes it (also what tab2file
  # stores, Heft.TabFile).
  def __compression_shape__({:auto, c}), do: {:auto, __compression_shape__(c)}

  def __compression_shape__({:zstd, level, dict}),
    do: {:zstd, [level: level, dictionary: if(dict, do: :auto, else: :none)]}

  def __compression_shape__(other), do: other

  defp kernel_view(ref) do
    case Native.kernel_view(ref) do
      %{} = view -> {:ok, view}
      {:error, _} -> {:ok, Map.new(@kernel_items, &{&1, nil})}
    end
  rescue
    ArgumentError -> :error
  end

  @doc """
  Trains a zstd dictionary on the table's records, makes it the one new
  writes use, and re-compresses older records with it in the background.
  For a table with `compression: {:zstd, dictionary: :auto}` (which does
  this on its own as it grows, see "Compression") or `compression: :auto` (which
  then also chooses its codec again from the new samples).

  Options:

    * `samples: n` - records to train on (default 4,096; at least 64 are
      needed), spread over the whole table: every (size / n)th record in
      walk order.
    * `dictionary_bytes: d` - the dictionary's size (at most 1 MiB; zstd
      may make it smaller). By default about a tenth of the samples'
      bytes, between 1 KiB and 16 KiB.
    * `recompress: false` - leave older records as they are.

  Sampling copies the records out a chunk at a time under the table's
  read lock, training runs on a thread of its own, off the schedulers,
  holding no lock: readers and writers are never stopped. The calling
  process waits for the dictionary (typically tens of milliseconds);
  re-compression then goes on in the background, observable in
  `info(tab, :recompression)`.

  Returns `{:ok, id}` once new writes use dictionary `id` (for
  `compression: :auto`, `{:ok, :none}` if it chose another codec), or
  `{:error, reason}`, changing nothing: `:busy` (another training is
  under way), `:too_few_records`, `:training_failed` (zstd found nothing
  to learn), `:deleted`. Raises `ArgumentError` for a bad option, for a
  table with another compression, and for a protected or private table
  when the caller is not its owner.
  """
  @spec train_dictionary(tab, keyword) :: {:ok, pos_integer | :none} | {:error, atom}
  def train_dictionary(tab, opts \\ []) do
    opts =
      Heft.Args.options!(opts, "Heft.train_dictionary/2",
        samples: &(is_integer(&1) and &1 >= 1),
        dictionary_bytes: &(is_integer(&1) and &1 >= 1 and &1 <= 1_048_576),
        recompress: &is_boolean/1
      )

    {samples, _max_bytes, _min} = Native.learn_defaults()
    tag = :erlang.unique_integer([:positive])

    started =
      Native.train_dictionary(
        ref(tab),
        Keyword.get(opts, :samples, samples),
        Keyword.get(opts, :dictionary_bytes, 0),
        Keyword.get(opts, :recompress, true),
        tag
      )

    case started do
      :ok ->
        receive do
          {:heft_trained, ^tag, result} -> result
        end

      error ->
        error
    end
  end

  @doc """
  Compacts the table's arena now: packs the records together from the
  start of the arena, in address order, and gives the top of the arena
  back (a memory arena's pages to the kernel; a file arena's file is cut
  short): the arena then uses what its records need. Keys do not move:
  readers, walks and continuations are not affected; no record is copied
  to the caller.

  A table compacts on its own once its freed blocks still in memory are
  at least 1 MiB and a fifth of its arena's used bytes (after deletes and
  overwrites, and after a dictionary re-compression). Those runs, one
  table at a time on one thread shared by every table (not a scheduler),
  take at most half a core and hold the table's lock for at most 128
  blocks or 64 KiB of records moved at a time: readers and writers go
  on. After a run that gained nothing, a table waits until another 1 MiB
  is freed.
  `compact/1` runs on that thread too (after any run queued before it),
  also paced to half a core, whatever there is to gain; the calling
  process waits.

  Returns `{:ok, %{moved_records: r, moved_bytes: m, returned_bytes: b,
  longest_lock_hold_us: us}}` (`b`: how far `info(tab, :memory)` came
  down: the arena's used bytes, and an ordered_set's index pages, packed
  too; `us`: the longest the compaction
  held the table's lock at once, what a reader or writer may have waited),
  with zeros when there was nothing to gain or another compaction of the
  table was running, `{:error, :deleted}` if the table was deleted
  meanwhile, or `{:error, :compaction_failed}` if the compaction met
  something it could not move (a defect: every record stays readable and
  the compaction ends). Needs read access (a compaction changes no
  object): raises `ArgumentError` for a private table when the caller is
  not its owner, or a table that does not exist. `info(tab, :compaction)`
  keeps the totals.
  """
  @spec compact(tab) ::
          {:ok,
           %{
             moved_records: non_neg_integer,
             moved_bytes: non_neg_integer,
             returned_bytes: non_neg_integer,
             longest_lock_hold_us: non_neg_integer
           }}
          | {:error, :deleted | :compaction_failed}
  def compact(tab) do
    tag = :erlang.unique_integer([:positive])
    :ok = Native.compact(ref(tab), tag)

    receive do
      {:heft_compacted, ^tag, result} -> result
    end
  end

  @doc "The identifier of the named table `name`, or `:undefined`."
  @spec whereis(atom) :: Heft.Table.t() | :undefined
  def whereis(name) when is_atom(name), do: Native.whereis(name)

  def whereis(name),
    do: raise(ArgumentError, "whereis/1 needs an atom, got: #{inspect(name)}")

  @doc "Every table of this node, like `:ets.all/0`."
  @spec all() :: [tab]
  def all, do: Native.all()

  @doc """
  Makes `pid` the owner and sends it
  `{:"HEFT-TRANSFER", tab, self(), data}`. Only the owner may give a table
  away, and not to itself or to a dead process. Returns `true`.
  """
  @spec give_away(tab, pid, term) :: true
  def give_away(tab, pid, data) when is_pid(pid), do: Native.give_away(ref(tab), pid, data)

  def give_away(_tab, pid, _data),
    do: raise(ArgumentError, "give_away/3 needs a pid, got: #{inspect(pid)}")

  @doc """
  Renames the table. A named table is then found by its new name only, and
  `rename/2` returns that name; renaming an unnamed table changes only its
  `info(tab, :name)` and returns the table. Raises `ArgumentError` if a
  named table already has that name (including this table itself).

  A persistent table stores its new name in its directory, so `open/2`
  reopens it under that name; raises `Heft.Error` if that write fails
  (the table is renamed in the VM all the same).
  """
  @spec rename(tab, atom) :: tab
  def rename(tab, name) when is_atom(name) do
    # The resource, which a named table's old name no longer finds after.
    resource =
      case ref(tab) do
        old when is_atom(old) -> with %Heft.Table{ref: r} <- Native.whereis(old), do: r
        r -> r
      end

    renamed = Native.rename(ref(tab), name)
    Heft.Persist.stored(resource, :name, name)
    renamed
  end

  def rename(_tab, name),
    do: raise(ArgumentError, "rename/2 needs an atom, got: #{inspect(name)}")

  @doc """
  Sets table options, as `:ets.setopts/2`: the heir (`{:heir, pid, data}`
  or `{:heir, :none}`) and the protection (`{:protection, :public |
  :protected | :private}`), one option or a list of them, each at most
  once, all checked before any is set. Owner only. A persistent table
  stores its new protection in its directory, so `open/2` reopens it with
  it; raises `Heft.Error` if that write fails (the protection is changed
  in the VM all the same).
  """
  @spec setopts(tab, tuple | [tuple]) :: true
  def setopts(tab, opts) do
    ref = ref(tab)
    opts = opts |> List.wrap() |> table_options!(opts)

    # Nothing to set: the caller must still own the table (it exists).
    if opts == [] and Native.info_map(ref).owner != self() do
      raise ArgumentError, "only the owner may set the table's options"
    end

    Enum.each(opts, fn
      {:heir, heir} -> Native.set_heir(ref, heir)
      {:protection, p} -> Native.set_protection(ref, p)
    end)

    with {:ok, p} <- Keyword.fetch(opts, :protection),
         do: Heft.Persist.stored(ref, :protection, p)

    true
  end

  # setopts/2's options, as {:heir, :none | {pid, data} | pid} and
  # {:protection, p}, each at most once (as in ETS), all checked before
  # any is set.
  defp table_options!(list, opts) do
    unless Heft.Args.proper_list?(list) do
      raise ArgumentError, "Heft.setopts/2 expects options, got: #{inspect(opts)}"
    end

    without_data = Heft.VM.fact(:heir_without_data)

    parsed =
      Enum.map(list, fn
        {:heir, :none} -> {:heir, :none}
        {:heir, pid, data} when is_pid(pid) and node(pid) == node() -> {:heir, {pid, data}}
        {:heir, pid} when is_pid(pid) and node(pid) == node() and without_data -> {:heir, pid}
        {:protection, p} when p in [:public, :protected, :private] -> {:protection, p}
        opt -> raise ArgumentError, "Heft.setopts/2: unknown option #{inspect(opt)}"
      end)

    if parsed |> Keyword.keys() |> Enum.frequencies() |> Enum.any?(fn {_, n} -> n > 1 end) do
      raise ArgumentError, "Heft.setopts/2: an option given twice in #{inspect(opts)}"
    end

    parsed
  end

  ## Persistence

  @doc """
  Reopens the persistent table stored in `dir` (after a VM restart, say)
  with the options it was created with: name, type, keypos, protection,
  compression, sync mode and dump thresholds are read from the directory.
  The caller becomes the owner. Loads the last snapshot and replays the
  log after it (see "Persistence" in the module doc).

  Options override what is stored: `:name`, `:sync`,
  `:dump_log_write_threshold`, `:dump_log_time_threshold`, and also
  `max_bytes:` and `max_records:` (see "Budgets and eviction"; not
  stored), `ttl:` (see "Expiry"; not stored), `arena:` (as for `new/2`:
  where the working copy is loaded, default memory; not stored),
  `heir: {pid, data}` and `repair: true` (keep everything before damage in
  the middle of the log, set the rest aside as `lost-*` files, and report
  it in `info(tab, :repaired)` as `%{file: f, offset: o, bytes: n,
  records_dropped: r}`: the first damage, the bytes set aside or lost, and
  the records not loaded because they name atoms whose definitions were
  lost with a damaged or missing snapshot; a repair never keeps a record
  it cannot decode as it was written). A damaged META cannot be repaired
  by `open/2`, which needs the options it holds: `new/2` with the table's
  options and `repair: true` rewrites it.

  Returns `{:ok, tab}` or `{:error, reason}`:

    * `:enoent` - `dir` holds no Heft table.
    * `:locked` - the table is open, in this VM or another OS process. A
      table of this VM whose owner has died is closed first, and an open
      waits for a close under way in this VM, so that the directory opens
      once its owner's `DOWN` or `EXIT` has arrived.
    * `{:corrupt, file, offset}` - `file` (a name in `dir`) is damaged at
      byte `offset`: before the end of the log, anywhere in a table closed
      cleanly, or a file of another table; `repair: true` opens it.
    * `{:missing, file}` - a file the table needs is gone: a log segment,
      the snapshot, or the `MANIFEST` that says which exist;
      `repair: true` opens what is left.
    * `:eloop` - a symbolic link was planted at a table file's name (never
      followed).
    * `:eperm` - the directory belongs to another user.
    * `{:unsupported_version, file, version}` - written by a newer Heft.
    * `:zero_key_conflict` - the table was written on OTP 27 or later, where
      `0.0` and `-0.0` are different keys, and holds keys (or, in a bag,
      objects) that differ only in the sign of a zero, which are one on
      this OTP 26 or older VM: opening it would lose an object, so it is
      closed as it was. Open it on OTP 27 or later and delete one of each
      such pair first. (A table written under the other rule without such
      pairs opens: its keys that hold a float zero move to where this VM
      looks for them, once, and the table then records this VM's rule.)
    * `:name_taken` - a named table with this name exists.
    * `:eacces`, `:eio`, `:enospc`... - a POSIX error.
    * `{:badarg, message}` - the options stored in `dir` are not valid
      ones.

  Raises `ArgumentError`, before it reads anything, if `dir` is not a
  file name or an option is unknown or invalid.

  ## Examples

      iex> dir = Path.join(System.tmp_dir!(), "heft-doc-open")
      iex> File.rm_rf!(dir)
      iex> tab = Heft.new(:people, persist: dir)
      iex> Heft.insert(tab, {1, "Ada"})
      true
      iex> Heft.close(tab)
      :ok
      iex> {:ok, tab} = Heft.open(dir)
      iex> Heft.lookup(tab, 1)
      [{1, "Ada"}]
      iex> Heft.delete(tab)
      true
  """
  @spec open(Path.t(), keyword) :: {:ok, tab} | {:error, term}
  def open(dir, opts \\ []), do: Heft.Persist.open(dir, opts)

  @doc """
  Closes a persistent table: syncs its log to disk, stops its threads,
  releases its directory and removes it from the VM. Its files stay; open
  it again with `open/2`. Owner only, unless the table is `:public`.

  Returns `:ok`, or `{:error, :poisoned}` if a sync had failed earlier
  (what was written since may be lost), or `{:error, posix}` if the last
  sync fails. The table is closed either way. Raises `ArgumentError` for
  a table that is not persistent.
  """
  @spec close(tab) :: :ok | {:error, atom}
  def close(tab), do: Native.persist_close_io(ref(tab), false)

  @doc """
  Folds the log of a persistent table into a new snapshot now, and waits
  for it. Readers and writers keep going meanwhile. If a dump is already
  running, this waits for the one after it, and the table reports itself
  overloaded (`info(tab, :overloaded)`, `subscribe/1`).

  Returns `:ok`, or `{:error, reason}` (`:enospc`..., `:poisoned`,
  `:closed`); the log keeps everything when a dump fails.
  """
  @spec dump(tab) :: :ok | {:error, atom}
  def dump(tab), do: Native.await(Native.persist_dump(ref(tab)))

  @doc """
  Waits until every change made so far to a persistent table is on stable
  storage (one fsync, shared with concurrent callers). Returns `:ok` or
  `{:error, reason}` (`:eio`..., `:poisoned`).
  """
  @spec sync(tab) :: :ok | {:error, atom}
  def sync(tab), do: Native.await(Native.persist_sync(ref(tab)))

  @doc """
  Subscribes `pid` (default: the caller) to a persistent table's news.
  Messages:

    * `{:heft_overloaded, tab, %{behind_records: n, threshold: t,
      dump_running_ms: ms, reason: :write_threshold | :requested}}` - a
      dump was wanted while one was running: the log holds `n` writes the
      running dump does not cover.
    * `{:heft_dumped, tab, %{records: n, atoms: a, bytes: b, ms: ms}}` - a
      dump finished.
    * `{:heft_dump_failed, tab, {:error, reason}}` - a dump failed; the
      log keeps everything and the next dump retries.

  Returns `:ok`. A dead subscriber is forgotten.
  """
  @spec subscribe(tab, pid) :: :ok
  def subscribe(tab, pid \\ self()), do: Native.persist_subscribe(ref(tab), pid!(pid), true)

  @doc "Stops `subscribe/2`'s messages to `pid`. Returns `:ok`."
  @spec unsubscribe(tab, pid) :: :ok
  def unsubscribe(tab, pid \\ self()), do: Native.persist_subscribe(ref(tab), pid!(pid), false)

  defp pid!(pid) when is_pid(pid), do: pid
  defp pid!(other), do: raise(ArgumentError, "not a pid: #{inspect(other)}")
end
