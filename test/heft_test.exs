defmodule HeftTest do
  # Heft's own behaviour, beyond what the shared ETS contract suite checks:
  # options, figures in bytes, failures, file arenas.
  use ExUnit.Case, async: true
  doctest Heft

  describe "new/2 options" do
    test "an unknown or ill-typed option raises ArgumentError naming it" do
      for {opt, named} <- [
            {:bogus, ":bogus"},
            {{:keypos, 0}, ":keypos"},
            {{:keypos, :a}, ":keypos"},
            {{:compression, :brotli}, ":compression"},
            {{:compression_level, 10}, ":compression_level"},
            {{:arena, :disk}, ":arena"},
            {{:heir, :nobody, 1}, ":heir"},
            {{:read_concurrency, :yes}, ":read_concurrency"}
          ] do
        error = assert_raise ArgumentError, fn -> Heft.new(:t, [opt]) end
        assert error.message =~ named, "#{inspect(opt)}: #{error.message}"
      end
    end

    test "a file arena needs an existing directory" do
      error =
        assert_raise ArgumentError, fn -> Heft.new(:t, arena: {:file, "/nonexistent/dir"}) end

      assert error.message =~ "/nonexistent/dir"
    end

    test "ETS's tuning options are accepted, :compressed means zlib" do
      t = Heft.new(:t, [{:read_concurrency, true}, {:write_concurrency, :auto}, :compressed])
      assert Heft.info(t, :compression) == {:zlib, 1}
      t2 = Heft.new(:t, compression: :none)
      assert Heft.info(t2, :compression) == :none
      t3 = Heft.new(:t, compression_level: 9)
      assert Heft.info(t3, :compression) == {:zlib, 9}
    end

    test "every ETS table type is accepted; the last one given wins, as in ETS" do
      for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
        assert Heft.info(Heft.new(:t, [type]), :type) == type
      end

      assert Heft.info(Heft.new(:t, [:bag, :ordered_set]), :type) == :ordered_set
      assert Heft.info(Heft.new(:t, []), :type) == :set
    end
  end

  describe "memory in bytes" do
    test "memory is index + meta + arena used, and every figure is in bytes" do
      t = Heft.new(:t, [])
      rows = for i <- 1..5_000, do: {i, String.duplicate("x", 200)}
      Heft.insert(t, rows)
      info = Heft.info(t)
      assert info[:size] == 5_000

      assert info[:memory] ==
               info[:index_bytes] + info[:meta_bytes] + info[:arena_used_bytes]

      # 5,000 records of a 200-byte string compress far below 200 bytes each,
      # and the arena holds at least what its live blocks hold.
      assert info[:payload_raw_bytes] > 5_000 * 200
      assert info[:payload_stored_bytes] < info[:payload_raw_bytes] / 5
      assert info[:arena_live_bytes] >= info[:payload_stored_bytes]
      assert info[:arena_used_bytes] >= info[:arena_live_bytes]
      assert info[:arena_mapped_bytes] >= info[:arena_used_bytes]
      # The kernel has the arena's used pages resident, and a memory arena's
      # pages are all dirty (never written back).
      assert info[:arena_resident_bytes] >= info[:arena_used_bytes] - 4096
      assert info[:arena_dirty_bytes] == info[:arena_resident_bytes]
      assert Heft.info(t, :memory) == info[:memory]
    end

    test "deleting objects makes their space reusable; delete_all_objects frees it" do
      t = Heft.new(:t, compression: :none)
      Heft.insert(t, for(i <- 1..2_000, do: {i, :binary.copy("y", 500)}))
      used = Heft.info(t, :arena_used_bytes)
      for i <- 1..2_000, do: Heft.delete(t, i)
      assert Heft.info(t, :arena_live_bytes) == 0
      assert Heft.info(t, :arena_free_bytes) > 0
      Heft.insert(t, for(i <- 1..2_000, do: {-i, :binary.copy("z", 500)}))
      assert Heft.info(t, :arena_used_bytes) == used
      Heft.delete_all_objects(t)
      assert Heft.info(t, :arena_used_bytes) < 100
      assert Heft.info(t, :size) == 0
    end

    test "values that shrink fill the space the larger ones left" do
      t = Heft.new(:t, compression: :none)
      Heft.insert(t, for(i <- 1..2_000, do: {i, :binary.copy("y", 500)}))
      used = Heft.info(t, :arena_used_bytes)
      # Freed, the 512-byte blocks are cut to hold records a fifth their
      # size: twice as many as there were, with room to spare.
      for i <- 1..1_000, do: Heft.delete(t, i)
      Heft.insert(t, for(i <- -1..-2_000//-1, do: {i, :binary.copy("n", 100)}))
      assert Heft.info(t, :arena_used_bytes) == used
      # Overwritten by smaller values, 100 keys at a time (a batch's new
      # records are placed before its old ones are freed): the arena grows
      # by the first batch at most.
      for c <- Enum.chunk_every(1_001..2_000, 100),
          do: Heft.insert(t, for(i <- c, do: {i, :binary.copy("s", 100)}))

      assert Heft.info(t, :arena_used_bytes) < used + 100 * 128
      assert Heft.lookup(t, 1_007) == [{1_007, :binary.copy("s", 100)}]
      assert Heft.lookup(t, -1_999) == [{-1_999, :binary.copy("n", 100)}]
      info = Heft.info(t)
      assert info[:arena_live_bytes] + info[:arena_free_bytes] + 8 == info[:arena_used_bytes]
    end

    test "overwriting the same keys many times does not grow the table" do
      t = Heft.new(:t, [])
      # Values change every round; their sizes come from the same
      # distribution each round.
      write = fn round ->
        Heft.insert(t, for(k <- 1..1_000, do: {k, rem(round, 7), "v#{rem(k * round, 97)}"}))
      end

      for round <- 1..20, do: write.(round)
      used = Heft.info(t, :arena_used_bytes)
      for round <- 21..300, do: write.(round)
      assert Heft.info(t, :arena_used_bytes) == used
    end
  end

  describe "failures" do
    test "a Rust panic becomes an exception and the VM goes on" do
      assert_raise ErlangError, ~r/nif_panicked/, fn -> Heft.Native.debug_panic() end
      t = Heft.new(:after_panic, [])
      assert Heft.insert(t, {1, 2})
      assert Heft.lookup(t, 1) == [{1, 2}]
    end

    test "a non-table raises ArgumentError" do
      assert_raise ArgumentError, fn -> Heft.lookup("nope", 1) end
      assert_raise ArgumentError, fn -> Heft.lookup(:no_such_table, 1) end
      assert Heft.info(:no_such_table) == :undefined
      assert Heft.info(:no_such_table, :size) == :undefined
      assert_raise ArgumentError, fn -> Heft.info(Heft.new(:t, []), :bogus) end
    end
  end

  describe "list keys" do
    test "a list or [] as a key (the -0.0 scan once looped forever on [])" do
      t = Heft.new(:list_keys, [])
      keys = [[], [1], [1, [2, []]], [:a | :b], {[]}]
      for k <- keys, do: assert(Heft.insert(t, {k, :v}))
      for k <- keys, do: assert(Heft.lookup(t, k) == [{k, :v}])
    end
  end

  describe "file arenas" do
    @describetag :tmp_dir

    test "the file is 0600 in the given directory and removed with the table", %{tmp_dir: dir} do
      t = Heft.new(:filed, arena: {:file, dir})
      Heft.insert(t, for(i <- 1..1_000, do: {i, i * 2}))
      assert Heft.lookup(t, 500) == [{500, 1000}]
      {:file, path} = Heft.info(t, :arena)
      assert Path.dirname(path) == dir
      assert File.stat!(path).mode |> Bitwise.band(0o777) == 0o600
      Heft.delete(t)
      refute File.exists?(path)
    end

    test "the file is removed when the owner dies", %{tmp_dir: dir} do
      parent = self()

      pid =
        spawn(fn ->
          t = Heft.new(:filed, arena: {:file, dir})
          send(parent, {:path, Heft.info(t, :arena)})
          Process.sleep(:infinity)
        end)

      assert_receive {:path, {:file, path}}
      assert File.exists?(path)
      ref = Process.monitor(pid)
      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, _, _, _}
      assert Heft.Test.Wait.until(fn -> not File.exists?(path) end)
    end
  end

  describe "a full disk" do
    @describetag :tmp_dir

    test "insert returns {:error, :enospc} and the table stays readable", %{tmp_dir: dir} do
      mnt = Path.join(dir, "small")
      File.mkdir_p!(mnt)

      case System.cmd("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
             stderr_to_stdout: true
           ) do
        {_, 0} ->
          try do
            t = Heft.new(:full, arena: {:file, mnt}, compression: :none)
            blob = :crypto.strong_rand_bytes(10_000)

            results = Enum.map(1..200, fn i -> {i, Heft.insert(t, {i, blob})} end)

            {ok, failed} = Enum.split_while(results, fn {_, r} -> r == true end)
            assert [{first_failed, {:error, :enospc}} | _] = failed
            assert length(ok) > 10
            # What was acknowledged is there; the failed insert left nothing.
            assert Heft.lookup(t, 1) == [{1, blob}]
            assert Heft.lookup(t, first_failed) == []
            assert Heft.info(t, :size) == length(ok)
            # A batch that does not fit fails as a whole.
            batch = [{:a, 1} | for(i <- 1..50, do: {{:b, i}, blob})]
            assert Heft.insert(t, batch) == {:error, :enospc}
            assert Heft.lookup(t, :a) == []
            assert Heft.info(t, :size) == length(ok)
            Heft.delete(t)
          after
            System.cmd("umount", [mnt])
          end

        {out, _} ->
          IO.puts("skipping the ENOSPC test: cannot mount a tmpfs here (#{String.trim(out)})")
      end
    end
  end
end
