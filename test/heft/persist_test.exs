defmodule Heft.PersistTest do
  # Persistent tables from the VM: options stored and restored, the
  # directory lock, file modes, path safety, a full disk, group commit,
  # owner death, poisoning, overload reports, damaged files. The engine's
  # own crash tests are in native/heft_core/tests/crash_consistency.rs;
  # SIGKILL of a writing VM is in persist_crash_test.exs.
  use ExUnit.Case, async: true
  import Bitwise
  alias Heft.Test.Wait

  @moduletag :tmp_dir

  defp dir(%{tmp_dir: tmp}, name \\ "t"), do: Path.join(tmp, name)

  defp mode(path), do: File.stat!(path).mode &&& 0o777

  test "a table reopens with every option restored", ctx do
    d = dir(ctx)

    t =
      Heft.new(:restored, [
        :public,
        :named_table,
        {:keypos, 2},
        compression: :none,
        persist: d,
        sync: {:interval, 20},
        dump_log_write_threshold: 1234,
        dump_log_time_threshold: 56_789
      ])

    assert t == :restored
    assert true == Heft.insert(t, [{:a, 1, "one"}, {:b, 2, "two"}])
    assert Heft.update_counter(t, 3, {3, 0}, {:c, 0, 0}) == 0
    assert true == Heft.delete(t, 2)
    :ok = Heft.close(t)
    assert Heft.info(:restored) == :undefined

    {:ok, t} = Heft.open(d)
    assert t == :restored
    info = Heft.info(t)
    assert info[:named_table] == true
    assert info[:keypos] == 2
    assert info[:protection] == :public
    assert info[:compression] == :none
    assert info[:sync] == {:interval, 20}
    assert info[:dump_log_write_threshold] == 1234
    assert info[:dump_log_time_threshold] == 56_789
    assert info[:persist] == d
    assert info[:owner] == self()
    assert Enum.sort(Heft.tab2list(t)) == [{:a, 1, "one"}, {:c, 3, 0}]
    assert info[:recovered_log_records] == 4
    # Options given to open/2 win, and are stored.
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d, name: :renamed, sync: :commit)
    assert t == :renamed
    assert Heft.info(t, :sync) == :commit
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :sync) == :commit
    assert true == Heft.delete(t)
    refute File.exists?(d)
  end

  test "select_delete by shape alone and of everything are logged and survive a reopen", ctx do
    for type <- [:set, :bag] do
      d = dir(ctx, "shape_#{type}")
      t = Heft.new(:shape, [type, persist: d])

      Heft.insert(
        t,
        for(
          i <- 1..2000,
          do: if(rem(i, 2) == 0, do: {rem(i, 300), i}, else: {rem(i, 300), i, :x})
        )
      )

      kept = t |> Heft.tab2list() |> Enum.filter(&(tuple_size(&1) == 3)) |> Enum.sort()
      assert Heft.select_delete(t, [{{:_, :_}, [], [true]}]) > 0
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(d)
      assert Enum.sort(Heft.tab2list(t)) == kept
      assert Heft.select_delete(t, [{:_, [], [true]}]) == length(kept)
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(d)
      assert Heft.info(t, :size) == 0
      :ok = Heft.close(t)
    end
  end

  test "rename/2 stores the new name: open/2 reopens the table under it", ctx do
    d = dir(ctx)
    t = Heft.new(:before, [:named_table, persist: d])
    true = Heft.insert(t, {1, :one})
    assert Heft.rename(t, :after) == :after
    assert Heft.info(:before) == :undefined
    :ok = Heft.close(:after)
    {:ok, t} = Heft.open(d)
    assert t == :after
    assert Heft.lookup(t, 1) == [{1, :one}]
    # An unnamed table keeps its new name as info(tab, :name).
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d, name: :third)
    assert Heft.rename(t, :fourth) == :fourth
    :ok = Heft.close(:fourth)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :name) == :fourth
    :ok = Heft.close(t)
    u = Heft.new(:unnamed, persist: Path.join(ctx.tmp_dir, "u"))
    %Heft.Table{} = Heft.rename(u, :renamed_unnamed)
    :ok = Heft.close(u)
    {:ok, u} = Heft.open(Path.join(ctx.tmp_dir, "u"))
    assert Heft.info(u, :name) == :renamed_unnamed
    :ok = Heft.close(u)
  end

  test "setopts/2 stores the protection: open/2 reopens the table with it", ctx do
    d = dir(ctx)
    t = Heft.new(:guarded, persist: d)
    assert Heft.setopts(t, {:protection, :private}) == true
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :protection) == :private
    assert %ArgumentError{} = Task.async(fn -> catch_error(Heft.lookup(t, 1)) end) |> Task.await()
    assert Heft.setopts(t, [{:protection, :public}, {:heir, :none}]) == true
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :protection) == :public
    :ok = Heft.close(t)
  end

  test "new/2 on a directory holding a table loads it; type and keypos must match", ctx do
    d = dir(ctx)
    t = Heft.new(:a, persist: d)
    Heft.insert(t, {1, :x})
    :ok = Heft.close(t)
    t = Heft.new(:a, persist: d, compression: :none)
    assert Heft.lookup(t, 1) == [{1, :x}]
    :ok = Heft.close(t)
    assert_raise ArgumentError, ~r/keypos/, fn -> Heft.new(:a, persist: d, keypos: 2) end
  end

  test "options: persistence needs :persist; bad values raise", ctx do
    assert_raise ArgumentError, ~r/:sync needs the option :persist/, fn ->
      Heft.new(:t, sync: :commit)
    end

    # The working copy may be in a file arena (tier_test.exs: tiered).
    t = Heft.new(:t, persist: dir(ctx), arena: {:file, ctx.tmp_dir})
    assert {:file, _} = Heft.info(t, :arena)
    :ok = Heft.close(t)

    for bad <- [sync: :always, sync: {:interval, 0}, dump_log_write_threshold: 0, persist: ""] do
      assert_raise ArgumentError, ~r/invalid value/, fn ->
        Heft.new(:t, [{:persist, "x"}, bad])
      end
    end

    assert_raise ArgumentError, ~r/not persistent/, fn -> Heft.close(Heft.new(:mem)) end
    assert Heft.open(Path.join(ctx.tmp_dir, "nothing")) == {:error, :enoent}
  end

  test "a second open fails with :locked, even in the same VM", ctx do
    d = dir(ctx)
    t = Heft.new(:locked, persist: d)
    assert Heft.open(d) == {:error, :locked}

    task = Task.async(fn -> Heft.open(d) end)
    assert Task.await(task) == {:error, :locked}

    error = assert_raise Heft.Error, fn -> Heft.new(:other, persist: d) end
    assert error.reason == :locked
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    :ok = Heft.close(t)
  end

  test "files are 0600 in a 0700 directory, with fixed names whatever the table's name", ctx do
    d = dir(ctx, "nested/dir")
    t = Heft.new(:"../../../etc/passwd\0/x", persist: d)
    Heft.insert(t, {1, 2})
    :ok = Heft.dump(t)
    assert mode(d) == 0o700
    files = File.ls!(d)

    assert (Enum.sort(files) --
              ["HASHKEY", "LOCK", "MANIFEST", "MANIFEST.reserve", "META", "snapshot"])
           |> Enum.all?(&(&1 =~ ~r/^wal-\d{20}$/))

    for f <- files, do: assert(mode(Path.join(d, f)) == 0o600, f)
    # Nothing was created outside the table's directory.
    assert File.ls!(ctx.tmp_dir) == ["nested"]
    assert File.ls!(Path.join(ctx.tmp_dir, "nested")) == ["dir"]
    :ok = Heft.close(t)
  end

  test "concurrent :commit writers share fsyncs (group commit)", ctx do
    t = Heft.new(:group, [:public, persist: dir(ctx), sync: :commit])
    parent = self()

    for p <- 1..100 do
      spawn_link(fn ->
        for i <- 1..10, do: true = Heft.insert(t, {{p, i}, i})
        send(parent, :done)
      end)
    end

    for _ <- 1..100, do: assert_receive(:done, 30_000)
    info = Heft.info(t)
    assert info[:size] == 1000
    assert info[:commits] == 1000
    assert info[:log_fsyncs] < 300, "#{info[:log_fsyncs]} fsyncs for 1,000 commits"
    :ok = Heft.close(t)
  end

  test "sync: :commit per call, sync/1 and the log figures", ctx do
    t = Heft.new(:percall, persist: dir(ctx))
    assert Heft.info(t, :log_fsyncs) == 0
    assert true == Heft.insert(t, [{1, :a}, {2, :b}])
    assert Heft.info(t, :log_fsyncs) == 0
    assert true == Heft.insert(t, {3, :c}, sync: :commit)
    assert Heft.info(t, :log_fsyncs) == 1
    assert Heft.info(t, :commits) == 1
    assert false == Heft.insert_new(t, {3, :d}, sync: :commit)
    assert :ok == Heft.sync(t)
    info = Heft.info(t)
    assert info[:log_records] == 3
    assert info[:log_batches] == 2
    assert info[:log_bytes] > 0
    assert_raise ArgumentError, fn -> Heft.insert(t, {4, :e}, sync: :sometimes) end
    :ok = Heft.close(t)
  end

  test "a table keeps its hash key: reopened, its walk order is the same; a bad key file is replaced",
       ctx do
    d = dir(ctx)
    t = Heft.new(:keyed, persist: d)
    true = Heft.insert(t, for(i <- 1..2000, do: {i, i}))
    order = Heft.tab2list(t)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    key_file = Path.join(d, "HASHKEY")
    key = File.read!(key_file)
    assert byte_size(key) == 28 and mode(key_file) == 0o600

    {:ok, t} = Heft.open(d)
    assert Heft.tab2list(t) == order
    :ok = Heft.close(t)

    # A damaged key is ignored: the table loads (in another order) and
    # stores a new key.
    File.write!(key_file, "not a key")
    {:ok, t} = Heft.open(d)
    assert Enum.sort(Heft.tab2list(t)) == Enum.sort(order)
    assert Heft.tab2list(t) != order
    :ok = Heft.close(t)
    new_key = File.read!(key_file)
    assert byte_size(new_key) == 28 and new_key != key

    # delete/1 removes it with the rest.
    {:ok, t} = Heft.open(d)
    true = Heft.delete(t)
    refute File.exists?(key_file)
  end

  test "opening and closing without writes leaves no trail of empty log segments", ctx do
    d = dir(ctx)
    segments = fn -> d |> File.ls!() |> Enum.filter(&String.starts_with?(&1, "wal-")) end
    t = Heft.new(:quiet, persist: d)
    true = Heft.insert(t, for(i <- 1..100, do: {i, i}))
    :ok = Heft.close(t)
    after_write = segments.()

    for _ <- 1..5 do
      {:ok, t} = Heft.open(d)
      :ok = Heft.close(t)
      assert segments.() == after_write
    end

    # A write in between is kept, in a segment of its own.
    {:ok, t} = Heft.open(d)
    true = Heft.insert(t, {:late, 1})
    :ok = Heft.close(t)
    assert length(segments.()) == length(after_write) + 1

    # After a dump the log starts at the dump's segment, which stays even
    # when nothing follows it.
    {:ok, t} = Heft.open(d)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    after_dump = segments.()
    assert length(after_dump) == 1

    for _ <- 1..3 do
      {:ok, t} = Heft.open(d)
      assert Heft.info(t, :size) == 101
      assert Heft.lookup(t, :late) == [{:late, 1}]
      :ok = Heft.close(t)
    end

    assert segments.() == after_dump
  end

  test "a table whose owner dies is closed, not deleted, and reopens", ctx do
    d = dir(ctx)
    parent = self()

    pid =
      spawn(fn ->
        t = Heft.new(:orphan, [:named_table, persist: d, sync: :none])
        Heft.insert(t, for(i <- 1..1000, do: {i, i * i}))
        send(parent, :written)
      end)

    ref = Process.monitor(pid)
    assert_receive :written
    assert_receive {:DOWN, ^ref, _, _, _}
    # The close runs on the table's threads; open waits for it.
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :size) == 1000
    assert Heft.lookup(t, 12) == [{12, 144}]
    :ok = Heft.close(t)
  end

  test "a failed fsync poisons the table until it is reopened", ctx do
    d = dir(ctx)
    t = Heft.new(:poison, persist: d, sync: :commit)
    true = Heft.insert(t, {1, :kept})
    :ok = Heft.Native.persist_inject_fault(t.ref, :eio, 1)
    assert Heft.insert(t, {2, :maybe}) == {:error, :eio}
    assert Heft.insert(t, {3, :refused}) == {:error, :poisoned}
    assert Heft.info(t, :poisoned) == true
    assert Heft.lookup(t, 1) == [{1, :kept}], "still readable"
    assert Heft.lookup(t, 3) == []
    assert Heft.close(t) == {:error, :poisoned}
    {:ok, t} = Heft.open(d)
    assert Heft.lookup(t, 1) == [{1, :kept}]
    assert true == Heft.insert(t, {4, :fine})
    :ok = Heft.close(t)
  end

  # Each write's spec names {:error, atom} for this.
  test "every write of a poisoned table returns {:error, :poisoned} and changes nothing", ctx do
    t = Heft.new(:poison_all, persist: dir(ctx), sync: :commit)
    true = Heft.insert(t, [{1, 0, :a}, {2, 0, :b}, {3, 0, :c}])
    :ok = Heft.Native.persist_inject_fault(t.ref, :eio, 1)
    {:error, :eio} = Heft.insert(t, {4, 0, :d})
    before = Enum.sort(Heft.tab2list(t))

    writes = [
      insert: fn -> Heft.insert(t, {5, 0, :e}) end,
      insert_3: fn -> Heft.insert(t, {5, 0, :e}, sync: :commit) end,
      insert_new: fn -> Heft.insert_new(t, {5, 0, :e}) end,
      insert_new_3: fn -> Heft.insert_new(t, {5, 0, :e}, sync: :commit) end,
      delete: fn -> Heft.delete(t, 1) end,
      delete_object: fn -> Heft.delete_object(t, {2, 0, :b}) end,
      delete_all_objects: fn -> Heft.delete_all_objects(t) end,
      take: fn -> Heft.take(t, 3) end,
      update_counter: fn -> Heft.update_counter(t, 1, {2, 1}) end,
      update_counter_4: fn -> Heft.update_counter(t, 6, {2, 1}, {6, 0, :f}) end,
      update_element: fn -> Heft.update_element(t, 1, {3, :z}) end,
      select_delete: fn -> Heft.select_delete(t, [{:_, [], [true]}]) end,
      select_replace: fn -> Heft.select_replace(t, [{{1, 0, :_}, [], [{{1, 0, :y}}]}]) end,
      match_delete: fn -> Heft.match_delete(t, {:_, :_, :_}) end,
      init_table: fn -> Heft.init_table(t, fn _ -> :end_of_input end) end
    ]

    for {name, write} <- writes do
      assert {name, write.()} == {name, {:error, :poisoned}}
      assert Enum.sort(Heft.tab2list(t)) == before, "#{name} changed the table"
    end

    assert Heft.close(t) == {:error, :poisoned}
  end

  test "a log that cannot be written fails the write and changes nothing", ctx do
    t = Heft.new(:nospace, persist: dir(ctx))
    true = Heft.insert(t, {1, :a})
    :ok = Heft.Native.persist_inject_fault(t.ref, :enospc, 1)
    assert Heft.insert(t, [{2, :b}, {3, :c}]) == {:error, :enospc}
    assert Heft.info(t, :size) == 1
    assert true == Heft.insert(t, {4, :d})
    :ok = Heft.close(t)
  end

  test "a full disk returns :enospc and the table stays readable", ctx do
    mnt = Path.join(ctx.tmp_dir, "small")
    File.mkdir_p!(mnt)

    case System.cmd("mount", ["-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt],
           stderr_to_stdout: true
         ) do
      {_, 0} ->
        try do
          # Whether a sync waits for each write or not, the write that
          # finds no room fails alone (the MANIFEST keeps room reserved).
          for sync <- [:none, :commit] do
            d = Path.join(mnt, "#{sync}")
            full_disk(d, sync)
            File.rm_rf!(d)
          end
        after
          System.cmd("umount", ["-l", mnt])
        end

      {out, _} ->
        IO.puts("\nskipped the tmpfs ENOSPC test: mount failed: #{String.trim(out)}")
    end
  end

  defp full_disk(d, sync) do
    t =
      Heft.new(:full,
        persist: d,
        sync: sync,
        compression: :none,
        dump_log_write_threshold: 1_000_000
      )

    blob = :crypto.strong_rand_bytes(10_000)

    results =
      Enum.reduce_while(1..1000, [], fn i, acc ->
        case Heft.insert(t, {i, blob}) do
          true -> {:cont, [i | acc]}
          {:error, reason} -> {:halt, {reason, acc}}
        end
      end)

    assert {:enospc, written} = results
    assert length(written) > 50
    assert Heft.info(t, :size) == length(written)
    assert [{_, ^blob}] = Heft.lookup(t, hd(written))
    # Deleting needs log space too; reading never does.
    assert length(Heft.tab2list(t)) == length(written)
    Heft.close(t)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :size) == length(written)
    Heft.close(t)
  end

  test "a dump asked for during a dump reports overload to subscribers and info/2", ctx do
    t = Heft.new(:busy, [:public, persist: dir(ctx), dump_log_write_threshold: 10_000_000])
    :ok = Heft.subscribe(t)

    for c <- Enum.chunk_every(1..300_000, 5000),
        do: true = Heft.insert(t, Enum.map(c, &{&1, "value #{&1}"}))

    assert Heft.info(t, :overloaded) == false
    # The second request must come while the first dump runs; on a loaded
    # host the first can finish before this process gets to ask, so try a
    # few times: every try that overlapped must report, and one must overlap.
    assert Enum.any?(1..5, fn i -> overlapping_dumps_report_overload(t, i) end)
    assert Heft.info(t, :overloaded) == false
    :ok = Heft.close(t)
  end

  defp overlapping_dumps_report_overload(t, i) do
    dumps = Heft.info(t, :dumps)
    first = Task.async(fn -> Heft.dump(t) end)
    # The dump has begun once it cut the log: what was pending is its.
    assert Wait.until(fn -> Heft.info(t, :dumping) and Heft.info(t, :log_pending_records) == 0 end)

    true = Heft.insert(t, {:late, i})
    overlapped = Heft.info(t, :dumping)
    second = Task.async(fn -> Heft.dump(t) end)

    reported =
      receive do
        {:heft_overloaded, ^t, %{behind_records: behind, reason: :requested}} ->
          assert behind >= 1
          assert %{behind_records: _} = Heft.info(t, :overloaded)
          true
      after
        if(overlapped, do: 5000, else: 0) -> false
      end

    assert Task.await(first, 60_000) == :ok
    assert Task.await(second, 60_000) == :ok
    assert_receive {:heft_dumped, ^t, %{records: n}} when n >= 300_000
    assert Heft.info(t, :dumps) >= dumps + 2
    flush_dumped(t)
    reported
  end

  defp flush_dumped(t) do
    receive do
      {:heft_dumped, ^t, _} -> flush_dumped(t)
      {:heft_overloaded, ^t, _} -> flush_dumped(t)
    after
      50 -> :ok
    end
  end

  test "damage in the log is refused unless repaired (torn tails: persist_crash_test.exs)", ctx do
    d = dir(ctx)
    t = Heft.new(:damaged, persist: d)
    for i <- 1..3, do: true = Heft.insert(t, for(j <- 1..10, do: {{i, j}, :binary.copy("x", 50)}))
    :ok = Heft.close(t)
    [wal] = File.ls!(d) |> Enum.filter(&String.starts_with?(&1, "wal-"))
    path = Path.join(d, wal)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :recovered_torn_bytes) == 0
    assert Heft.info(t, :size) == 30
    :ok = Heft.close(t)

    # Flip a byte inside the first of the three batches (after the
    # 24-byte header and the 25-byte start frame).
    bytes = File.read!(path)
    <<head::binary-size(60), b, rest::binary>> = bytes
    File.write!(path, <<head::binary, bxor(b, 0xFF), rest::binary>>)
    assert {:error, {:corrupt, ^wal, 49}} = Heft.open(d)
    {:ok, t} = Heft.open(d, repair: true)
    assert Heft.info(t, :size) == 0
    assert %{file: ^wal, offset: 49, bytes: dropped} = Heft.info(t, :repaired)
    assert dropped > 0
    assert File.exists?(Path.join(d, "lost-" <> wal))
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    :ok = Heft.close(t)
  end

  test "writes to a persistent table run on a normal scheduler", ctx do
    # The log append is a copy into a mapping: no system call. Only when
    # the log needs a new segment does a write move to a dirty I/O
    # scheduler, which makes room.
    t = Heft.new(:sched, persist: dir(ctx))
    assert Heft.Native.insert(t.ref, {1, 2}) == true
    assert Heft.Native.lookup(t.ref, 1) == [{1, 2}]
    assert Heft.Native.insert_io(t.ref, {1, 3}) == true
    assert Heft.Native.lookup(t.ref, 1) == [{1, 3}]
    :ok = Heft.close(t)
  end

  test "writes fill segment after segment; every one survives a reopen", ctx do
    d = dir(ctx)
    t = Heft.new(:segments, [:public, persist: d, compression: :none])
    blob = :binary.copy("s", 3000)

    for p <- 1..4 do
      spawn_link(fn ->
        for i <- 1..1000, do: true = Heft.insert(t, {{p, i}, blob})
      end)
    end

    for big <- 1..5, do: true = Heft.insert(t, {{:big, big}, :binary.copy("b", 3_000_000)})
    Process.sleep(10)
    assert Wait.until(fn -> Heft.info(t, :size) == 4005 end)
    segments = Heft.info(t, :log_segments)
    assert segments >= 5, "#{segments} segments for 27 MB of log"
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :size) == 4005
    assert [{{3, 1000}, ^blob}] = Heft.lookup(t, {3, 1000})
    assert Heft.info(t, :recovered_torn_bytes) == 0
    :ok = Heft.close(t)
  end
end
