defmodule Heft.TabFileTest do
  # tab2file/file2tab: round trips side by side with :ets.tab2file/file2tab,
  # then one test per way a file can be damaged (docs/tab-file.md lists the
  # errors), each named after it.
  use ExUnit.Case, async: true

  @moduletag :tmp_dir

  @objects for i <- 1..1_000,
               do: {i, "value #{i}", [i, :atom, {i * 1.5}], %{k: i}, <<i::32>>}

  defp heft_file(dir, objects \\ @objects, opts \\ []) do
    t = Heft.new(:tab_file_test, [:public | opts])
    Heft.insert(t, objects)
    path = Path.join(dir, "t.heft")
    assert Heft.tab2file(t, path) == :ok
    Heft.delete(t)
    path
  end

  # The byte offsets at which the file's frames start (after magic and
  # version), read from their length fields.
  defp frame_offsets(bytes), do: frame_offsets(bytes, 10, [])

  defp frame_offsets(bytes, offset, acc) when offset >= byte_size(bytes), do: Enum.reverse(acc)

  defp frame_offsets(bytes, offset, acc) do
    {_, <<_tag, _seq::32, _count::32, len::little-32, _::binary>>} =
      :erlang.split_binary(bytes, offset)

    frame_offsets(bytes, offset + 21 + len, [offset | acc])
  end

  # A named table of a name no other test uses: file2tab would register
  # it again, so `Heft.whereis/1` shows whether a failed file2tab left it.
  defp named_file(dir, objects) do
    name = :"tab_file_#{System.unique_integer([:positive])}"
    t = Heft.new(name, [:named_table])
    Heft.insert(t, objects)
    path = Path.join(dir, "#{name}.heft")
    assert Heft.tab2file(t, path) == :ok
    Heft.delete(t)
    {path, name}
  end

  describe "round trips" do
    test "objects and options come back as ETS's do", %{tmp_dir: dir} do
      for opts <- [
            [],
            [{:keypos, 2}, :private, {:compression, :none}],
            [:named_table, :protected, {:compression_level, 6}]
          ] do
        ets_opts =
          Enum.reject(opts, &match?({c, _} when c in [:compression, :compression_level], &1))

        # (Not [:public | opts]: ETS lets :public win over a later
        # :protected, Heft.new/2 lets the last one win.)
        e = :ets.new(:tab_file_rt, ets_opts)
        h = Heft.new(:tab_file_rt, opts)
        objects = for i <- 1..700, do: {:rec, i, "v#{i}"}
        :ets.insert(e, objects)
        Heft.insert(h, objects)
        ets_path = Path.join(dir, "ets.tab") |> String.to_charlist()
        heft_path = Path.join(dir, "heft.tab")
        assert :ets.tab2file(e, ets_path) == :ok
        assert Heft.tab2file(h, heft_path) == :ok
        :ets.delete(e)
        Heft.delete(h)

        {:ok, e2} = :ets.file2tab(ets_path)
        {:ok, h2} = Heft.file2tab(heft_path)
        assert Enum.sort(Heft.tab2list(h2)) == Enum.sort(:ets.tab2list(e2))

        for item <- [:name, :named_table, :type, :keypos, :protection] do
          assert Heft.info(h2, item) == :ets.info(e2, item), "#{inspect(opts)}: #{item}"
        end

        assert Heft.info(h2, :owner) == self()
        :ets.delete(e2)
        Heft.delete(h2)
      end
    end

    test "compression is stored; the arena is chosen on reading", %{tmp_dir: dir} do
      path = heft_file(dir, @objects, compression: :zlib, compression_level: 4)
      {:ok, t} = Heft.file2tab(path, arena: {:file, dir}, verify: true)
      assert Heft.info(t, :compression) == {:zlib, 4}
      assert {:file, _} = Heft.info(t, :arena)
      assert Enum.sort(Heft.tab2list(t)) == @objects
    end

    test "an empty table", %{tmp_dir: dir} do
      path = heft_file(dir, [])
      {:ok, t} = Heft.file2tab(path)
      assert Heft.info(t, :size) == 0
    end

    test "sync: true; no temporary file is left", %{tmp_dir: dir} do
      t = Heft.new(:synced, [])
      Heft.insert(t, @objects)
      path = Path.join(dir, "synced.heft")
      assert Heft.tab2file(t, path, sync: true) == :ok
      assert File.ls!(dir) == ["synced.heft"]
      assert {:ok, _} = Heft.file2tab(path)
    end

    test "a named table whose name is taken is not created", %{tmp_dir: dir} do
      t = Heft.new(:tab_file_named, [:named_table])
      Heft.insert(t, {1, 2})
      path = Path.join(dir, "named.heft")
      assert Heft.tab2file(t, path) == :ok
      assert Heft.file2tab(path) == {:error, :cannot_create_table}
      Heft.delete(t)
      assert Heft.file2tab(path) == {:ok, :tab_file_named}
      assert Heft.lookup(:tab_file_named, 1) == [{1, 2}]
    end

    test "bad options and tables raise", %{tmp_dir: dir} do
      t = Heft.new(:opts, [])
      assert_raise ArgumentError, fn -> Heft.tab2file(t, Path.join(dir, "x"), bogus: 1) end
      assert_raise ArgumentError, fn -> Heft.file2tab(Path.join(dir, "x"), bogus: 1) end
      assert_raise ArgumentError, fn -> Heft.tab2file(:no_such_table, Path.join(dir, "x")) end
    end

    test "file system errors are POSIX reasons", %{tmp_dir: dir} do
      t = Heft.new(:posix, [])
      assert Heft.tab2file(t, Path.join([dir, "no", "such", "dir"])) == {:error, :enoent}
      assert Heft.file2tab(Path.join(dir, "missing")) == {:error, :enoent}
      assert {:error, reason} = Heft.file2tab(dir)
      assert reason in [:eisdir, :eacces]
    end
  end

  describe "damaged files are refused" do
    test "empty file", %{tmp_dir: dir} do
      path = Path.join(dir, "empty")
      File.write!(path, "")
      assert Heft.file2tab(path) == {:error, :badfile}
    end

    test "wrong magic", %{tmp_dir: dir} do
      path = heft_file(dir)
      <<_::binary-8, rest::binary>> = File.read!(path)
      File.write!(path, "ETS-TAB!" <> rest)
      assert Heft.file2tab(path) == {:error, :badfile}
      File.write!(path, :erlang.term_to_binary(@objects))
      assert Heft.file2tab(path) == {:error, :badfile}
    end

    test "newer version", %{tmp_dir: dir} do
      path = heft_file(dir)
      <<magic::binary-8, 1::little-16, rest::binary>> = File.read!(path)
      File.write!(path, <<magic::binary, 3::little-16, rest::binary>>)
      assert Heft.file2tab(path) == {:error, {:unsupported_version, 3}}
    end

    test "truncated at every frame boundary and inside every frame", %{tmp_dir: dir} do
      {path, name} = named_file(dir, @objects)
      bytes = File.read!(path)
      offsets = frame_offsets(bytes)
      assert length(offsets) >= 4, "meta, several object frames, end"

      cuts =
        for o <- offsets, cut <- [o, o + 5, o + 17, o + 40], cut < byte_size(bytes), do: {o, cut}

      for {frame, cut} <- cuts ++ [{List.last(offsets), byte_size(bytes) - 1}] do
        File.write!(path, binary_part(bytes, 0, cut))
        assert Heft.file2tab(path) == {:error, {:truncated, frame}}, "cut at #{cut}"
      end

      File.write!(path, binary_part(bytes, 0, 8))
      assert Heft.file2tab(path) == {:error, {:truncated, 8}}
      File.write!(path, binary_part(bytes, 0, 5))
      assert Heft.file2tab(path) == {:error, :badfile}
      assert Heft.whereis(name) == :undefined, "a failed file2tab leaves no table"
    end

    test "flipped byte in the middle", %{tmp_dir: dir} do
      path = heft_file(dir)
      bytes = File.read!(path)
      middle = div(byte_size(bytes), 2)
      frame = bytes |> frame_offsets() |> Enum.filter(&(&1 <= middle)) |> List.last()
      {a, <<b, c::binary>>} = :erlang.split_binary(bytes, middle)
      File.write!(path, <<a::binary, Bitwise.bxor(b, 0x10), c::binary>>)
      assert Heft.file2tab(path) == {:error, {:corrupt, frame}}
    end

    test "any single flipped byte anywhere", %{tmp_dir: dir} do
      {path, name} = named_file(dir, for(i <- 1..20, do: {i, i}))
      bytes = File.read!(path)

      for pos <- 0..(byte_size(bytes) - 1) do
        {a, <<b, c::binary>>} = :erlang.split_binary(bytes, pos)
        File.write!(path, <<a::binary, Bitwise.bxor(b, 0x01), c::binary>>)
        assert {:error, reason} = Heft.file2tab(path), "flip at #{pos}"

        assert match?(:badfile, reason) or match?({:corrupt, _}, reason) or
                 match?({:unsupported_version, _}, reason),
               "flip at #{pos}: #{inspect(reason)}"
      end

      assert Heft.whereis(name) == :undefined
    end

    test "a dropped frame", %{tmp_dir: dir} do
      path = heft_file(dir)
      bytes = File.read!(path)
      [_meta, first, second | _] = frame_offsets(bytes)

      File.write!(
        path,
        binary_part(bytes, 0, first) <> binary_part(bytes, second, byte_size(bytes) - second)
      )

      assert Heft.file2tab(path) == {:error, {:corrupt, first}}
    end

    test "bytes after the end frame", %{tmp_dir: dir} do
      path = heft_file(dir)
      bytes = File.read!(path)
      File.write!(path, bytes <> "x")
      assert Heft.file2tab(path) == {:error, {:corrupt, byte_size(bytes)}}
    end
  end

  describe "format: :ets" do
    # tab2file(format: :ets) of a Heft table against :ets.tab2file of an
    # ETS table holding the same objects: ETS's file2tab (verifying) and
    # tabfile_info read both alike, and so does Heft's file2tab.
    test "ETS reads what Heft writes in its format", %{tmp_dir: dir} do
      objects = for i <- 1..700, do: {i, "v#{i}", {:rec, [i]}, %{i: i}, 1.5 * i}

      for type <- [:set, :ordered_set, :bag, :duplicate_bag],
          opts <- [[], [:named_table, :public, {:keypos, 2}]],
          ext <- [[], [:object_count], [:md5sum], [:md5sum, :object_count]] do
        name = :"ets_format_#{System.unique_integer([:positive])}"
        t = Heft.new(name, [type | opts])
        Heft.insert(t, objects)
        path = Path.join(dir, "#{name}.tab")
        assert Heft.tab2file(t, path, format: :ets, extended_info: ext) == :ok
        Heft.delete(t)

        info = :ets.tabfile_info(String.to_charlist(path))
        assert {:ok, items} = info

        assert Map.new(Keyword.take(items, [:name, :type, :keypos, :named_table, :size])) ==
                 %{
                   name: name,
                   type: type,
                   named_table: :named_table in opts,
                   keypos: Keyword.get(opts, :keypos, 1),
                   size: 700
                 }

        assert Heft.tabfile_info(path) == info

        verify = ext != []
        assert {:ok, e} = :ets.file2tab(String.to_charlist(path), verify: verify)
        assert Enum.sort(:ets.tab2list(e)) == Enum.sort(objects), inspect({type, opts, ext})
        assert :ets.info(e, :type) == type
        :ets.delete(e)

        assert {:ok, h} = Heft.file2tab(path, verify: verify)
        assert Enum.sort(Heft.tab2list(h)) == Enum.sort(objects)
        Heft.delete(h)
      end

      assert Path.wildcard(Path.join(dir, ".heft-tab-*"), match_dot: true) == []
    end

    test "a changed object fails ETS's checksum", %{tmp_dir: dir} do
      t = Heft.new(:ets_format, [])
      Heft.insert(t, for(i <- 1..100, do: {i, "value #{i}"}))
      path = Path.join(dir, "t.tab")
      assert Heft.tab2file(t, path, format: :ets, extended_info: [:md5sum]) == :ok
      bytes = File.read!(path)
      {at, _} = :binary.match(bytes, "value 50")
      File.write!(path, :binary.replace(bytes, "value 50", "value 5X"))
      assert byte_size(File.read!(path)) == byte_size(bytes) and at > 0
      assert :ets.file2tab(String.to_charlist(path), verify: true) == {:error, :checksum_error}
      assert Heft.file2tab(path, verify: true) == {:error, :checksum_error}
    end

    test "a link at the file is replaced, not written through", %{tmp_dir: dir} do
      target = Path.join(dir, "target")
      File.write!(target, "keep")
      path = Path.join(dir, "t.tab")
      File.ln_s!(target, path)
      t = Heft.new(:ets_format, [])
      Heft.insert(t, {1, 2})
      assert Heft.tab2file(t, path, format: :ets) == :ok
      assert File.read!(target) == "keep"
      assert {:ok, e} = :ets.file2tab(String.to_charlist(path))
      assert :ets.tab2list(e) == [{1, 2}]
    end

    test "bad options raise; a missing directory is an error", %{tmp_dir: dir} do
      t = Heft.new(:ets_format, [])
      assert_raise ArgumentError, fn -> Heft.tab2file(t, Path.join(dir, "x"), format: :dets) end

      assert_raise ArgumentError, fn ->
        Heft.tab2file(t, Path.join(dir, "x"), format: :ets, extended_info: [:crc])
      end

      assert Heft.tab2file(t, Path.join([dir, "none", "x"]), format: :ets) == {:error, :enoent}
    end
  end

  describe "files ETS's tab2file wrote" do
    # Each file is read by :ets.file2tab/2 of this VM and by Heft: same
    # answer, same objects, same options.
    defp ets_file(dir, objects, opts, tab2file_opts \\ []) do
      path = Path.join(dir, "ets-#{System.unique_integer([:positive])}.tab")
      e = :ets.new(:ets_written, opts)
      :ets.insert(e, objects)
      assert :ets.tab2file(e, String.to_charlist(path), tab2file_opts) == :ok
      :ets.delete(e)
      path
    end

    # Both readers' answers to `path`, compared; the tables are deleted.
    defp both_read(path, opts \\ []) do
      ets = :ets.file2tab(String.to_charlist(path), opts)
      heft = Heft.file2tab(path, opts)

      case {ets, heft} do
        {{:ok, e}, {:ok, h}} ->
          assert Enum.sort(Heft.tab2list(h)) == Enum.sort(:ets.tab2list(e))

          for item <- [:name, :named_table, :type, :keypos, :protection],
              do: assert(Heft.info(h, item) == :ets.info(e, item), "#{item}")

          :ets.delete(e)
          Heft.delete(h)
          :ok

        {{:error, r}, {:error, r}} ->
          {:error, r}

        other ->
          flunk("ETS and Heft disagree on #{path}: #{inspect(other)}")
      end
    end

    test "every table type and option, with and without extended info", %{tmp_dir: dir} do
      objects = for i <- 1..700, do: {i, "v#{i}", {:rec, [i]}, %{i: i}}

      for type <- [:set, :ordered_set, :bag, :duplicate_bag],
          opts <- [[], [:named_table, :private, {:keypos, 2}], [:public, :compressed]],
          ext <- [[], [:object_count], [:md5sum], [:object_count, :md5sum]],
          verify <- [false, true] do
        path = ets_file(dir, objects, [type | opts], extended_info: ext)
        assert both_read(path, verify: verify) == :ok, "#{type} #{inspect(opts)} #{inspect(ext)}"
        assert Heft.tabfile_info(path) == :ets.tabfile_info(String.to_charlist(path))
      end
    end

    test "an empty table", %{tmp_dir: dir} do
      assert both_read(ets_file(dir, [], [:set]), verify: true) == :ok
    end

    test "a named table whose name is taken", %{tmp_dir: dir} do
      path = ets_file(dir, [{1}], [:named_table])
      e = :ets.new(:ets_written, [:named_table])
      h = Heft.new(:ets_written, [:named_table])
      assert both_read(path) == {:error, :cannot_create_table}
      :ets.delete(e)
      Heft.delete(h)
    end

    # Rewrites the file's terms with `fun` (a list: header, objects..., end).
    defp rewrite(path, fun) do
      log = make_ref()
      file = String.to_charlist(path)
      {:ok, ^log} = :disk_log.open(name: log, file: file, mode: :read_only)
      terms = all_terms(log, :start, [])
      :ok = :disk_log.close(log)
      File.rm!(path)
      {:ok, ^log} = :disk_log.open(name: log, file: file, mode: :read_write)
      :ok = :disk_log.log_terms(log, fun.(terms))
      :ok = :disk_log.close(log)
    end

    defp all_terms(log, cont, acc) do
      case :disk_log.chunk(log, cont) do
        :eof -> acc
        {cont, terms} -> all_terms(log, cont, acc ++ terms)
      end
    end

    test "a lost object: a count error only when verifying", %{tmp_dir: dir} do
      objects = for i <- 1..10, do: {i, Integer.to_string(i)}

      for ext <- [[], [:object_count]] do
        path = ets_file(dir, objects, [:set], extended_info: ext)
        rewrite(path, fn [header | rest] -> [header | List.keydelete(rest, 8, 0)] end)
        assert both_read(path) == :ok
        assert both_read(path, verify: true) == {:error, :invalid_object_count}
      end
    end

    test "a changed object: a checksum error only when verifying", %{tmp_dir: dir} do
      path = ets_file(dir, for(i <- 1..10, do: {i, "#{i}"}), [:set], extended_info: [:md5sum])
      rewrite(path, fn [header | rest] -> [header | List.keyreplace(rest, 8, 0, {8, "9"})] end)
      assert both_read(path) == :ok
      assert both_read(path, verify: true) == {:error, :checksum_error}
    end

    test "a header without a mandatory item is a bad file", %{tmp_dir: dir} do
      path = ets_file(dir, [{:a, 1}, {:b, 2}], [:set])

      rewrite(path, fn [header | rest] ->
        [header |> Tuple.to_list() |> List.keydelete(:protection, 0) |> List.to_tuple() | rest]
      end)

      assert both_read(path) == {:error, :badfile}
      assert Heft.tabfile_info(path) == {:error, :badfile}
      assert :ets.tabfile_info(String.to_charlist(path)) == {:error, :badfile}
      assert :disk_log.all() == []
    end

    test "damaged bytes: loaded around when not verifying, refused when verifying",
         %{tmp_dir: dir} do
      objects = for i <- 1..10_000, do: {i, Integer.to_string(i)}
      path = ets_file(dir, objects, [:set], extended_info: [:md5sum])
      good = File.read!(path)

      for at <- 700..800//10 do
        {before, <<byte, rest::binary>>} = :erlang.split_binary(good, at)
        File.write!(path, <<before::binary, rem(byte + 1, 255), rest::binary>>)
        assert {:error, _} = Heft.file2tab(path, verify: true)
        assert {:error, _} = :ets.file2tab(String.to_charlist(path), verify: true)
      end

      assert :disk_log.all() == []
    end
  end
end
