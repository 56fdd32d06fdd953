defmodule Heft.Memory do
  @moduledoc """
  What memory a node, its tables and its host really have, in bytes.

  `:ets.info/2` and `:mnesia.info/0` count words, `:erlang.memory/0` knows
  nothing of NIF allocations or mapped files, and nothing compares the total
  with the host's RAM, the cgroup limit or the kernel's dirty-page budget.
  This module does, for the node it runs on:

    * `host/0`: RAM, swap, dirty page cache, the cgroup limit and usage, the
      kernel's writeback budget resolved to bytes, I/O pressure.
    * `node/0`: what the VM allocated, what the process has resident (RSS),
      what Heft holds natively, and the unexplained rest, adding up to RSS.
    * `ets/0`: every ETS table and every Heft table, largest first.
    * `sizing/3`: what N records like a few samples would need in an ETS
      set, a compressed ETS set and Heft, and whether that fits.
    * `snapshot/0` and `warnings/1`: all of the above in one map, with the
      problems found in it as data.

  Every figure is an integer number of **bytes** (shares are floats between
  0 and 1, pressure figures are percentages). Where the kernel writes "kB"
  (`/proc/meminfo`, smaps) it means KiB and is converted. A figure that
  cannot be read on this machine (no cgroup, no swap, no PSI, an older
  kernel, Heft not loaded) is `nil`, never an estimate.

  `Heft.Report` prints the same data for people. Erlang callers use the
  same functions: `'Elixir.Heft.Memory':host()`.

  Linux only: everything but `:erlang.memory/0` and ETS comes from `/proc`
  and `/sys/fs/cgroup`.
  """

  # node/0 and node/1 are this module's own.
  import Kernel, except: [node: 0, node: 1]

  alias Heft.Memory.{Beam, Host, Sizing, Source, Tables, Warnings}

  @typedoc "A count of bytes."
  @type bytes :: non_neg_integer

  @typedoc "One problem found in a snapshot; see `warnings/1`."
  @type warning :: {:error | :warning | :info, atom, String.t()}

  @doc """
  The host's memory as the kernel sees it, in bytes.

  Returns a map:

    * `:mem_total`: MemTotal, RAM the kernel manages (physical RAM minus
      what firmware and the kernel image reserve). Not a cgroup's limit.
    * `:mem_free`: MemFree, RAM holding nothing. Much lower than what is
      usable, since page cache is counted as used.
    * `:mem_available`: MemAvailable, the kernel's estimate of what can be
      allocated without swapping: free RAM plus the reclaimable part of
      page cache and slab. The figure to compare a new table with.
    * `:buffers`, `:cached`, `:shmem`, `:active_file`, `:inactive_file`:
      the meminfo figures of the same names (page cache; `:cached` includes
      `:shmem`, which includes memfd-backed Heft memory arenas; arenas on
      huge pages are anonymous memory, not shmem).
    * `:swap_total`, `:swap_free`, `:swap_used` (total minus free),
      `:swap_cached`: 0 when the host has no swap.
    * `:dirty`: meminfo Dirty, page cache modified and not yet written back
      (machine-wide, every process's files). `:writeback`: being written
      now.
    * `:cgroup`: the memory cgroup this OS process is charged to, or nil
      when it is in none that limits memory (see below).
    * `:cgroup_limit`, `:cgroup_usage`: shortcuts to `cgroup.limit` and
      `cgroup.usage` (nil without a cgroup; the limit is nil when none is
      set).
    * `:dirty_limits`: the kernel's writeback settings resolved to bytes:
      the six `vm.dirty_*` sysctls as read (`:dirty_background_bytes`,
      `:dirty_background_ratio`, `:dirty_bytes`, `:dirty_ratio`,
      `:dirty_expire_centisecs`, `:dirty_writeback_centisecs`; a `*_bytes`
      of 0 means the ratio applies), `:dirtyable_bytes` (free + file page
      cache, what the ratios are taken of; leaves out the kernel's reserve
      pages, a few MiB, which meminfo does not show), `:cgroup_dirtyable_bytes`
      (the same for a cgroup v2 with a limit, else nil),
      `:background_threshold` (dirty bytes above which the flusher starts
      writing), `:throttle_threshold` (above which writers are made to wait),
      both the smaller of the host's and the cgroup's, and `:expire_ms`
      (pages dirty longer are written back regardless of memory) and
      `:writeback_interval_ms` (how often the flusher wakes).
    * `:io_pressure`: `/proc/pressure/io` as
      `%{some: %{avg10: pct, avg60: pct, avg300: pct, total_us: us}, full: ...}`
      ("some": share of time at least one task waited on I/O; "full": all
      non-idle tasks did), or nil without PSI.

  The `:cgroup` map (v2 when the node's v2 cgroup has the memory
  controller, else the v1 memory controller):

    * `:version` (1 or 2), `:path` (as in /proc/self/cgroup), `:dir` (where
      its files were read).
    * `:limit`: the effective hard limit, the smallest `memory.max` of the
      cgroup and its ancestors (v1: `hierarchical_memory_limit`); nil when
      unlimited. `:limit_dir`: the directory that sets it. `:high` (v2
      `memory.high`, the throttling line; nil when unset or v1).
    * `:usage`: `memory.current` / `memory.usage_in_bytes`: everything
      charged to the cgroup, page cache included. `:working_set`: usage
      minus inactive file cache, what cannot be dropped cheaply (the
      figure kubelet evicts on). `:peak`: `memory.peak` (v2, Linux 5.19+) or
      `memory.max_usage_in_bytes` (v1), else nil.
    * `:swap_limit`, `:swap_usage`: the cgroup's swap (v1: memsw minus
      memory); nil when not accounted.
    * `:anon`, `:file`, `:shmem`, `:dirty`, `:writeback`: from
      `memory.stat`. `:oom_kills`: OOM kills in this cgroup so far, or nil.
    * `:io_pressure`: the cgroup's own `io.pressure` (v2), else nil.
  """
  @spec host() :: map
  def host, do: host([])

  @doc """
  Like `host/0`; `opts[:root]` reads `/proc` and `/sys` under another
  directory laid out like `/` (a fixture, a container's root).
  """
  @spec host(keyword) :: map
  def host(opts), do: Host.read(source(opts))

  @doc """
  This node's memory: the VM's view, the kernel's, Heft's, and the
  difference.

  Returns a map:

    * `:word_size`: bytes per word on this VM (8 on 64-bit). Nothing here is
      in words; it is stated so words elsewhere can be converted.
    * `:erlang`: `:erlang.memory/0`, already in bytes (`:total`,
      `:processes`, `:processes_used`, `:system`, `:atom`, `:atom_used`,
      `:binary`, `:code`, `:ets`). Counts blocks handed out by the ERTS
      allocators; leaves out their free space and NIF allocations (Heft).
    * `:erlang_carriers`: bytes the ERTS allocators hold from the OS
      (carriers; `:erlang.memory(:total)` plus allocator free space). Mapped,
      not necessarily resident.
    * `:erlang_mapped`: bytes the VM has mapped from the OS for its
      allocators (`erts_mmap`): the carriers it mapped and the segments
      `mseg_alloc` keeps cached after freeing them, which a node that built
      and dropped large terms may hold for long. A carrier an allocator got
      from malloc instead (`sys_alloc_carriers_size` in
      `:erlang.system_info({:allocator, a})`, once it holds as many mapped
      carriers as it may) is in `:erlang_carriers` but not here. nil where
      the VM does not say.
    * `:rss`: resident set of the OS process (smaps_rollup Rss, or
      `/proc/self/status` VmRSS on kernels before 4.14). Counts shared pages
      (libraries, memfd arenas) in full. `:pss`: proportional share (shared
      pages divided among their users), nil before 4.14. `:swap`: this
      process's pages in swap.
    * `:os_pid`: the OS process.
    * `:mappings`: resident memory by kind of mapping, from
      `/proc/self/smaps`: `%{heft_arena: m, heft_index: m, file: m,
      anonymous: m}` with `m = %{count, size, rss, dirty, swap}` (`:size`
      is the mapped address space). `:heft_arena`: Heft memory arenas
      (`[anon:heft:*]` on huge pages, found by address where the kernel
      does not name anonymous memory; else `/memfd:heft:*`) and file arenas
      (`heft-*.arena`); `:heft_index`:
      Heft's index slot arrays (`/memfd:heft-index:*`, or
      `[anon:heft-index:*]`); `:file`: other files
      (beam.smp, libraries, NIFs); `:anonymous`: heap, stacks and anonymous
      mmaps, where ERTS allocators live. nil if smaps cannot be read.
    * `:heft`: Heft's native memory summed over its tables (`:tables`,
      `:memory`, `:index_bytes`, `:index_resident_bytes`,
      `:dictionary_bytes` (zstd dictionaries, heap memory, so part of `u`
      below), `:arena_mapped_bytes`, `:arena_live_bytes`,
      `:arena_resident_bytes`, `:arena_dirty_bytes`, `:arena_swap_bytes`,
      each as `Heft.info/1` defines it; a figure Heft could not read counts
      as 0), or nil when Heft is not loaded.
    * `:parts`: the RSS split so it adds up exactly:
      `%{erlang: e, erlang_free: f, files: l, heft_index: i, heft_arenas:
      a, unexplained: u}` with `e + f + l + i + a + u == rss`. `e` is
      `:erlang.memory(:total)`; `f` what the VM has mapped for its
      allocators beyond that (`:erlang_mapped - e`: free blocks and cached
      segments); `l` the resident pages of file mappings (beam.smp, shared
      libraries, NIFs, the JIT's code); `i` the Heft indexes' resident
      bytes; `a` the arenas' resident bytes; `u` the rest (thread stacks,
      malloc heaps of the VM and of NIFs). `u` may be negative, since
      mapped is not always resident. nil when RSS cannot be read.
  """
  @spec node() :: map
  def node, do: node([])

  @doc "Like `node/0`, with `opts[:root]` as in `host/1` for the files."
  @spec node(keyword) :: map
  def node(opts) do
    source = source(opts)
    Beam.read(source, Tables.heft(source))
  end

  @doc """
  Every ETS table and every Heft table of this node, largest first.

  Returns `%{word_size: w, ets: [table], heft: [table] | nil}`.

  An ETS table is `%{id, name, owner, owner_name, size, type, compressed,
  words, bytes}`: `:size` is records, `:words` what `:ets.info/2` says and
  `:bytes` is `words * w`. It counts the table structure and the records
  copied into it; it leaves out refc binaries over 64 bytes, which the table
  only references (they are in `:erlang.memory(:binary)`).

  A Heft table is `Heft.info/1` as a map plus `:id` and `:owner_name`:
  `:memory` (bytes: index, metadata and arena space handed out; not the
  mapped-but-untouched pages), `:index_bytes`, `:arena`,
  `:arena_mapped_bytes`, `:arena_live_bytes`, `:arena_resident_bytes`,
  `:arena_dirty_bytes`, `:arena_swap_bytes`, `:payload_raw_bytes`,
  `:payload_stored_bytes` and the rest, as `Heft.info/1` documents them. `:heft` is nil when Heft is not
  loaded (unavailable, which is not the same as no tables).
  """
  @spec ets() :: %{word_size: pos_integer, ets: [map], heft: [map] | nil}
  def ets, do: tables(Source.local())

  @doc """
  Predicts the bytes `count` records like `samples` need in an ETS set, a
  compressed ETS set and Heft, and whether that fits.

  The samples are stored for real (in temporary tables, deleted after) and
  the cost per record is scaled to `count`; give a few hundred to a few
  thousand records with distinct keys, drawn from across the data: the
  prediction is exact for records like the samples, and `"user-1"` is a
  word shorter than `"user-999999"`. The ETS figures include the table's
  fixed overhead and its bucket array at `count` records, measured on a
  probe table of that size (up to a million records, extrapolated beyond;
  this takes about a second).

  Returns a map with `:ets`, `:ets_compressed` and `:heft` entries, each

    * `:bytes`: predicted total for `count` records;
    * `:share_of_available`: `bytes / host.mem_available`;
    * `:share_of_cgroup_limit`: `bytes / host.cgroup_limit`, nil without a
      limit;
    * `:fits`: whether the host would stay at or below 85% used (RAM minus
      MemAvailable, plus `bytes`) and the cgroup's working set plus `bytes`
      at or below 85% of its limit;
    * `:bytes_per_record` and details: ETS entries carry `:table_bytes`
      (words x word size, with the empty table's `:fixed_bytes`) and
      `:off_heap_binary_bytes` (refc binaries, stored outside the table);
      the Heft entry carries `:arena_bytes`, `:index_bytes` (by Heft's
      growth rule, `:index_model` `:doubling`, or scaled per record,
      `:linear`, if the rule does not match what the table reports) and
      `:compression_ratio` (raw payload / stored payload of the samples).

  `:heft` is nil when Heft is not loaded. Also `:count`, `:samples` and a
  `:verdict`: `:fits` (an ETS set, plain or compressed, fits),
  `:fits_in_heft_only` (no ETS set does, Heft does) or `:does_not_fit`.

  `:codecs` predicts a Heft set with every compression, in this order:
  `:none`, `:zlib`, `:lz4`, `:zstd` and `{:zstd, dictionary: :auto}` (nil
  when Heft is not loaded). The samples are encoded as a new table encodes
  them and compressed for real with each codec, record by record, as the
  table would store them; a dictionary codec trains its dictionary on the
  samples: each quarter of them is compressed with a dictionary trained on
  the other three quarters, because a table compresses many more records
  than it trained on (a dictionary judged on its own training samples
  promises too much). Each entry is a map with `:compression` (the
  `Heft.new/2` option), `:bytes` (predicted total for `count` records:
  the arena at the real table's empty size plus `count` times the arena
  blocks of a sample record, the dictionary's memory, and the index as
  above), `:arena_bytes`, `:index_bytes`, `:bytes_per_record` (arena
  blocks per record, size classes included), `:stored_bytes_per_record`
  (header, key and stored body), `:compression_ratio` (raw / stored),
  `:compressed_share` (share of the samples stored compressed; the rest
  stay raw because compressing them would not pay), `:dictionary_trained`
  (false when the samples were too few or too small to train on: the
  prediction is then plain zstd, as in a table that has no dictionary
  yet), `:dictionary_bytes` and `:dictionary_memory` (its bytes and what
  it takes in the table, digests included; 0 without one), `:decode_ns`
  (nanoseconds to decompress one record's body on this machine, measured
  now: the term decoding that follows is the same for every codec), and
  `:share_of_available`, `:share_of_cgroup_limit` and `:fits` as above.

  Options: `:compression` for the Heft table (default `:zlib`),
  `:headroom` (default 0.85), `:host` (a `host/0` map to judge against),
  `:dictionary_bytes` (the largest dictionary the `:codecs` prediction
  trains, default 16 KiB; like a table's, a dictionary is about a tenth of
  the bytes it is trained on, at least 1 KiB). A table with
  `dictionary: :auto` puts a dictionary in use only where it beats zstd
  alone: where the dictionary entry is no smaller than the `:zstd` one, the
  table will store plain zstd.

  ## Examples

      iex> samples = for i <- 1..1000, do: {i, %{id: i, name: "user-\#{i}"}}
      iex> s = Heft.Memory.sizing(samples, 1_000_000, [])
      iex> s.ets.bytes > 1_000_000 * 100
      true
  """
  @spec sizing([tuple], non_neg_integer, keyword) :: map
  def sizing(samples, count, opts \\ []) when is_list(samples) and samples != [],
    do: Sizing.run(samples, count, opts)

  @doc """
  Everything at once: `%{node_name, collected_at, host, node, tables,
  warnings}` with `host/0`, `node/0`, `ets/0` and `warnings/1` of it.
  `opts[:root]` as in `host/1`.
  """
  @spec snapshot(keyword) :: map
  def snapshot(opts \\ []), do: collect(source(opts))

  @doc """
  The problems in a snapshot, most severe first, as `{severity, code,
  message}` with severity `:error`, `:warning` or `:info`:

    * `:oom_risk_host` (error): the host is above 85% used (MemTotal minus
      MemAvailable).
    * `:oom_risk_cgroup` (error): the cgroup's working set is above 85% of
      its limit.
    * `:dirty_budget` (warning; error above the throttle line): file-backed
      Heft arenas, with the dirty data already on the host, can exceed the
      kernel's background (or throttle) threshold, so their pages are
      written to disk while in use. The message gives the
      `vm.dirty_background_bytes` / `vm.dirty_bytes` that would hold them,
      computed from this host's RAM and dirty data (or says none can).
      When the arenas hold more than half of the node's cgroup limit, the
      warning says so instead: the cgroup's reclaim writes their pages back
      and reads them again whatever the host-wide settings, and only a
      higher limit (or smaller arenas) helps.
    * `:dirty_expiry` (warning): file-backed arenas whose pages stay dirty
      longer than `vm.dirty_expire_centisecs` are written back however much
      RAM is free; the message gives timer values for a disposable arena
      (not given when the arenas outgrow their cgroup, as above). Heft's own
      durability never depends on these settings: a persistent table syncs
      its log itself. Both warnings concern plain file arenas only and
      suggest a tiered arena (`arena: {:file, dir, memory: bytes}`) instead:
      it writes nothing while its records fit the budget, and starts the
      writeback of what it moves to its file at once, so its pages do not
      stay dirty.
    * `:swap_in_use` (warning): this node or the host has pages in swap.
    * `:io_pressure` (warning): all tasks stalled on I/O 10% or more of the
      last minute.
    * `:words_not_bytes` (info): the largest ETS table is 1 MiB or more, and
      `:ets.info/2` (and `:mnesia.info/0`) quote it in words: the message
      gives the figure in words and in bytes.
    * `:heft_unavailable` (info): Heft is not loaded, its figures are nil.
  """
  @spec warnings(map) :: [warning]
  def warnings(snapshot), do: Warnings.check(snapshot)

  # Also used by Heft.Memory.Remote with a remote source.
  @doc false
  def collect(source) do
    heft = Tables.heft(source)
    tables = tables(source, heft)

    snapshot = %{
      node_name: Source.call(source, :erlang, :node, []),
      collected_at: DateTime.utc_now() |> DateTime.truncate(:second),
      host: Host.read(source),
      node: Beam.read(source, heft),
      tables: tables
    }

    Map.put(snapshot, :warnings, Warnings.check(snapshot))
  end

  defp tables(source, heft \\ :read) do
    word_size = Source.call(source, :erlang, :system_info, [:wordsize])
    heft = if heft == :read, do: Tables.heft(source), else: heft
    %{word_size: word_size, ets: Tables.ets(source, word_size), heft: heft}
  end

  defp source(opts), do: Source.local(Keyword.get(opts, :root, "/"))
end
