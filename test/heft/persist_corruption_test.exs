defmodule Heft.PersistCorruptionTest do
  # One test per way a table directory can be damaged, named after it
  # (docs/persistence-format.md, "Damage, mode by mode"): what a plain
  # open/2 answers, what `repair: true` reports in info(t, :repaired), and
  # exactly which records survive. The engine's own tests of the same
  # modes are in native/heft_core/tests/crash_consistency.rs.
  use ExUnit.Case, async: true
  import Bitwise

  @moduletag :tmp_dir

  defp dir(%{tmp_dir: tmp}, name \\ "t"), do: Path.join(tmp, name)

  defp wals(d),
    do: d |> File.ls!() |> Enum.filter(&String.starts_with?(&1, "wal-")) |> Enum.sort()

  defp contents(t), do: t |> Heft.tab2list() |> Enum.sort()

  # A table closed cleanly after `sessions` sessions of 10 records each:
  # one segment per session.
  defp sessions(d, n) do
    t = Heft.new(:c, persist: d)
    true = Heft.insert(t, for(j <- 1..10, do: {{1, j}, :one}))
    :ok = Heft.close(t)

    for i <- 2..n//1 do
      {:ok, t} = Heft.open(d)
      true = Heft.insert(t, for(j <- 1..10, do: {{i, j}, :binary.copy("v", i)}))
      :ok = Heft.close(t)
    end

    for i <- 1..n, j <- 1..10, do: {{i, j}, if(i == 1, do: :one, else: :binary.copy("v", i))}
  end

  defp reopened(d, opts \\ []) do
    {:ok, t} = Heft.open(d, opts)
    t
  end

  # Issue 9, section 6, first snippet.
  test "emptied snapshot: repair drops log records naming atoms the snapshot defined", ctx do
    d = dir(ctx)
    t = Heft.new(:a, persist: d)
    Heft.insert(t, [{1, :apple}])
    :ok = Heft.dump(t)
    Heft.insert(t, {4, :apple})
    :ok = Heft.close(t)
    File.write!(Path.join(d, "snapshot"), "")

    assert Heft.open(d) == {:error, {:corrupt, "snapshot", 0}}
    t = reopened(d, repair: true)

    assert Heft.info(t, :repaired) == %{
             file: "snapshot",
             offset: 0,
             bytes: 0,
             records_dropped: 1
           }

    Heft.insert(t, {:probe, :zebra})
    assert Heft.lookup(t, 4) == []
    assert contents(t) == [{:probe, :zebra}]
    :ok = Heft.close(t)
    t = reopened(d)
    assert contents(t) == [{:probe, :zebra}]
    assert Heft.info(t, :repaired) == false
    :ok = Heft.close(t)
  end

  test "damaged snapshot: records whose atoms the log defines survive, new atoms get fresh ids",
       ctx do
    d = dir(ctx)
    t = Heft.new(:b, persist: d)
    Heft.insert(t, [{1, :apple}])
    :ok = Heft.dump(t)
    Heft.insert(t, [{2, :banana}, {3, :apple}, {4, "plain"}])
    :ok = Heft.close(t)
    snap = Path.join(d, "snapshot")
    <<head::binary-size(60), b, rest::binary>> = File.read!(snap)
    File.write!(snap, <<head::binary, bxor(b, 1), rest::binary>>)

    assert {:error, {:corrupt, "snapshot", _}} = Heft.open(d)
    t = reopened(d, repair: true)
    assert %{file: "snapshot", records_dropped: 1} = Heft.info(t, :repaired)
    assert contents(t) == [{2, :banana}, {4, "plain"}]
    Heft.insert(t, {5, :cherry})
    :ok = Heft.close(t)
    t = reopened(d)
    assert contents(t) == [{2, :banana}, {4, "plain"}, {5, :cherry}]
    :ok = Heft.close(t)
  end

  test "missing snapshot: refused; repair replays the log it needed", ctx do
    d = dir(ctx)
    t = Heft.new(:m, persist: d)
    Heft.insert(t, [{1, :apple}])
    :ok = Heft.dump(t)
    Heft.insert(t, [{2, "two"}, {3, :apple}])
    :ok = Heft.close(t)
    File.rm!(Path.join(d, "snapshot"))

    assert Heft.open(d) == {:error, {:missing, "snapshot"}}
    t = reopened(d, repair: true)
    assert Heft.info(t, :repaired) == %{file: "snapshot", offset: 0, bytes: 0, records_dropped: 1}
    assert contents(t) == [{2, "two"}]
    :ok = Heft.close(t)
  end

  test "stale snapshot (an older copy put back): refused", ctx do
    d = dir(ctx)
    t = Heft.new(:st, persist: d)
    Heft.insert(t, [{1, "one"}])
    :ok = Heft.dump(t)
    old = File.read!(Path.join(d, "snapshot"))
    Heft.insert(t, [{2, "two"}])
    :ok = Heft.dump(t)
    Heft.insert(t, [{3, "three"}])
    :ok = Heft.close(t)
    File.write!(Path.join(d, "snapshot"), old)

    assert Heft.open(d) == {:error, {:corrupt, "snapshot", 0}}
    t = reopened(d, repair: true)
    assert %{file: "snapshot", offset: 0, records_dropped: 0} = Heft.info(t, :repaired)
    # The snapshot is not used (the log it needs is gone); the log after
    # the last dump is.
    assert contents(t) == [{3, "three"}]
    :ok = Heft.close(t)
  end

  # Issue 9, section 6, second snippet.
  test "deleted last segment: refused as missing, not opened empty", ctx do
    d = dir(ctx)
    t = Heft.new(:s, persist: d)
    Heft.insert(t, for(i <- 1..3000, do: {i, :crypto.strong_rand_bytes(1000)}))
    :ok = Heft.close(t)
    last = d |> wals() |> Enum.max()
    File.rm!(Path.join(d, last))

    assert Heft.open(d) == {:error, {:missing, last}}
    t = reopened(d, repair: true)
    assert Heft.info(t, :repaired) == %{file: last, offset: 0, bytes: 0, records_dropped: 0}
    assert Heft.info(t, :size) == 0
    :ok = Heft.close(t)
    t = reopened(d)
    :ok = Heft.close(t)
  end

  test "emptied last segment: refused", ctx do
    d = dir(ctx)
    want = sessions(d, 3)
    last = d |> wals() |> List.last()
    File.write!(Path.join(d, last), "")

    assert Heft.open(d) == {:error, {:corrupt, last, 0}}
    t = reopened(d, repair: true)
    assert %{file: ^last, offset: 0, records_dropped: 0} = Heft.info(t, :repaired)
    assert contents(t) == Enum.take(want, 20)
    :ok = Heft.close(t)
  end

  test "truncated last segment of a cleanly closed table: refused, not a torn tail", ctx do
    d = dir(ctx)
    t = Heft.new(:tr, persist: d)
    for i <- 1..5, do: true = Heft.insert(t, for(j <- 1..10, do: {{i, j}, :binary.copy("x", 50)}))
    :ok = Heft.close(t)
    [wal] = wals(d)
    path = Path.join(d, wal)
    bytes = File.read!(path)
    cut = byte_size(bytes) - 100
    File.write!(path, binary_part(bytes, 0, cut))

    assert {:error, {:corrupt, ^wal, at}} = Heft.open(d)
    assert at < cut
    t = reopened(d, repair: true)
    assert %{file: ^wal, offset: ^at} = Heft.info(t, :repaired)
    assert Heft.info(t, :recovered_torn_bytes) == 0
    # Whole batches only: the four before the cut one.
    assert Heft.info(t, :size) == 40

    assert contents(t) ==
             Enum.sort(for i <- 1..4, j <- 1..10, do: {{i, j}, :binary.copy("x", 50)})

    :ok = Heft.close(t)
  end

  test "junk appended after a cleanly closed log: refused", ctx do
    d = dir(ctx)
    sessions(d, 1)
    [wal] = wals(d)
    path = Path.join(d, wal)
    size = File.stat!(path).size
    File.write!(path, "partial frame", [:append])
    assert Heft.open(d) == {:error, {:corrupt, wal, size}}
  end

  test "deleted middle segment: refused; repair keeps the log before it", ctx do
    d = dir(ctx)
    want = sessions(d, 3)
    [_, middle, last] = wals(d)
    File.rm!(Path.join(d, middle))

    assert Heft.open(d) == {:error, {:missing, middle}}
    t = reopened(d, repair: true)
    assert %{file: ^middle, offset: 0} = Heft.info(t, :repaired)
    assert contents(t) == Enum.take(want, 10)
    assert File.exists?(Path.join(d, "lost-" <> last))
    :ok = Heft.close(t)
  end

  test "emptied middle segment: refused", ctx do
    d = dir(ctx)
    sessions(d, 3)
    [_, middle, _] = wals(d)
    File.write!(Path.join(d, middle), "")
    assert Heft.open(d) == {:error, {:corrupt, middle, 0}}
  end

  test "truncated middle segment: refused where its log was cut", ctx do
    d = dir(ctx)
    want = sessions(d, 3)
    [_, middle, _] = wals(d)
    path = Path.join(d, middle)
    bytes = File.read!(path)
    File.write!(path, binary_part(bytes, 0, byte_size(bytes) - 3))

    # The cut took 3 bytes of its end frame: its batches are whole.
    end_frame = byte_size(bytes) - 11
    assert Heft.open(d) == {:error, {:corrupt, middle, end_frame}}
    t = reopened(d, repair: true)
    assert %{file: ^middle, offset: ^end_frame, records_dropped: 0} = Heft.info(t, :repaired)
    assert contents(t) == Enum.take(want, 20)
    :ok = Heft.close(t)
  end

  test "bit flip in a frame: refused at that frame", ctx do
    d = dir(ctx)
    t = Heft.new(:flip, persist: d)
    for i <- 1..3, do: true = Heft.insert(t, for(j <- 1..10, do: {{i, j}, :binary.copy("x", 50)}))
    :ok = Heft.close(t)
    [wal] = wals(d)
    path = Path.join(d, wal)
    # Header (24 bytes), start frame (25), then the first batch's frame.
    <<head::binary-size(70), b, rest::binary>> = File.read!(path)
    File.write!(path, <<head::binary, bxor(b, 0xFF), rest::binary>>)

    assert Heft.open(d) == {:error, {:corrupt, wal, 49}}
    t = reopened(d, repair: true)
    assert %{file: ^wal, offset: 49, bytes: dropped} = Heft.info(t, :repaired)
    assert dropped > 0
    assert Heft.info(t, :size) == 0
    :ok = Heft.close(t)
    :ok = Heft.close(reopened(d))
  end

  test "segment of another table copied in: refused", ctx do
    a = dir(ctx, "a")
    b = dir(ctx, "b")
    want = sessions(a, 1)
    sessions(b, 1)
    [wal] = wals(a)
    File.cp!(Path.join(b, wal), Path.join(a, wal))

    assert Heft.open(a) == {:error, {:corrupt, wal, 0}}
    t = reopened(a, repair: true)
    assert %{file: ^wal, offset: 0} = Heft.info(t, :repaired)
    assert Heft.info(t, :size) == 0
    refute contents(t) == want
    :ok = Heft.close(t)
  end

  test "duplicated segment (a copy under the next number): refused", ctx do
    d = dir(ctx)
    sessions(d, 2)
    [first, second] = wals(d)
    File.cp!(Path.join(d, first), Path.join(d, second))
    assert Heft.open(d) == {:error, {:corrupt, second, 0}}
  end

  test "segment after the last one of a cleanly closed table: refused", ctx do
    d = dir(ctx)
    copy = dir(ctx, "copy")
    want = sessions(d, 2)
    File.cp_r!(d, copy)
    # A third session in the original; its segment, the table's own, put
    # into the copy, whose manifest says the log ended with the second.
    {:ok, t} = Heft.open(d)
    true = Heft.insert(t, {:third, 3})
    :ok = Heft.close(t)
    [_, _, third] = wals(d)
    File.cp!(Path.join(d, third), Path.join(copy, third))

    assert Heft.open(copy) == {:error, {:corrupt, third, 0}}
    t = reopened(copy, repair: true)
    assert %{file: ^third, offset: 0} = Heft.info(t, :repaired)
    assert contents(t) == want
    :ok = Heft.close(t)
  end

  test "deleted MANIFEST: refused; repair rebuilds it from the directory", ctx do
    d = dir(ctx)
    want = sessions(d, 2)
    File.rm!(Path.join(d, "MANIFEST"))

    assert Heft.open(d) == {:error, {:missing, "MANIFEST"}}
    t = reopened(d, repair: true)
    assert %{file: "MANIFEST", offset: 0, records_dropped: 0} = Heft.info(t, :repaired)
    assert contents(t) == want
    :ok = Heft.close(t)
    t = reopened(d)
    assert contents(t) == want
    :ok = Heft.close(t)
  end

  test "damaged MANIFEST: refused; repair rebuilds it", ctx do
    d = dir(ctx)
    want = sessions(d, 2)
    path = Path.join(d, "MANIFEST")
    <<head::binary-size(30), b, rest::binary>> = File.read!(path)
    File.write!(path, <<head::binary, bxor(b, 1), rest::binary>>)

    assert {:error, {:corrupt, "MANIFEST", _}} = Heft.open(d)
    t = reopened(d, repair: true)
    assert %{file: "MANIFEST"} = Heft.info(t, :repaired)
    assert contents(t) == want
    :ok = Heft.close(t)
  end

  test "damaged META: refused; new/2 with repair rewrites it from its options", ctx do
    d = dir(ctx)
    want = sessions(d, 1)
    File.write!(Path.join(d, "META"), "garbage")
    assert Heft.open(d) == {:error, {:corrupt, "META", 0}}
    # open/2 takes the table's options from META: it cannot repair it.
    assert Heft.open(d, repair: true) == {:error, {:corrupt, "META", 0}}
    t = Heft.new(:c, persist: d, repair: true)
    assert contents(t) == want
    :ok = Heft.close(t)
    :ok = Heft.close(reopened(d))
  end

  test "damaged or missing HASHKEY: opens, with a new key", ctx do
    d = dir(ctx)
    want = sessions(d, 1)
    File.write!(Path.join(d, "HASHKEY"), "garbage")
    t = reopened(d)
    assert contents(t) == want
    assert Heft.info(t, :repaired) == false
    :ok = Heft.close(t)
    File.rm!(Path.join(d, "HASHKEY"))
    t = reopened(d)
    assert contents(t) == want
    :ok = Heft.close(t)
    assert byte_size(File.read!(Path.join(d, "HASHKEY"))) == 28
  end

  test "an unused segment left by a crash after a clean close is removed", ctx do
    d = dir(ctx)
    want = sessions(d, 1)
    [wal] = wals(d)
    next = "wal-" <> String.pad_leading("2", 20, "0")
    File.write!(Path.join(d, next), "")
    _ = wal
    t = reopened(d)
    assert contents(t) == want
    :ok = Heft.close(t)
  end
end
