"""`arbor serve`'s gRPC Chat / ChatStream and server reflection as clients use them: a real
server process on loopback, driven by grpcio (stubs generated from proto/ at test time, as in
test_grpc.py). The references come from outside the gRPC chat path: Python jinja2 rendering
the chat template (the template file given to the server, and SmolLM2's own template read from
its GGUF with the gguf package), Generate on the token ids of that rendering (from Tokenize),
and HTTP /v1/chat/completions for the same conversation; reflection is read with the
grpcio-reflection package's ProtoReflectionDescriptorDatabase.

Needs grpcio, grpcio-tools, grpcio-reflection, jinja2 and gguf (scripts/setup_python.sh).
Run: ARBOR_BIN=build/server/arbor ARBOR_SHARED_DIR=../shared python3 tests/server/test_grpc_chat.py
"""
import json
import os
import sys
import time
import unittest
import urllib.error
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer  # noqa: E402
import test_grpc  # noqa: E402  (proto stubs generated at test time)
from test_grpc import channel, wait_for_free_blocks  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
CHATML = os.path.join(REPO, "tests", "data", "chat_templates", "smollm2.jinja")
SMOLLM2 = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL = "stories260K.bin"
DEFAULT_MAX_TOKENS = 24  # the chat server's --default-max-tokens

CONVERSATIONS = [
    [{"role": "user", "content": "Tell me a story about a cat."}],
    [{"role": "system", "content": "You tell short stories."},
     {"role": "user", "content": "Once upon a time"}],
    [{"role": "system", "content": "You tell stories."},
     {"role": "user", "content": "Lily and Ben"},
     {"role": "assistant", "content": "went to the park."},
     {"role": "user", "content": "What did they see?"}],
]


def setUpModule():
    test_grpc.setUpModule()


def tearDownModule():
    test_grpc.tearDownModule()


def pb():
    return test_grpc.pb


def render_jinja2(template, messages, bos="", eos=""):
    """The rendering transformers' apply_chat_template does (jinja2's sandbox, trim_blocks,
    lstrip_blocks, loopcontrols), independent of the server's own Jinja interpreter."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def chat_request(messages, **kw):
    return pb().ChatRequest(messages=[pb().ChatMessage(**m) for m in messages], **kw)


def stream_chat(stub, req, **kw):
    """Concatenates a ChatStream: {index: (text, token_ids, finish_reason)}, usage."""
    texts, tokens, finish = {}, {}, {}
    usage = None
    for msg in stub.ChatStream(req, **kw):
        indices = [c.index for c in msg.choices]
        assert len(set(indices)) == len(indices), f"a choice twice in one message: {indices}"
        for c in msg.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.token_ids)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
        if msg.HasField("usage"):
            usage = msg.usage
    return {i: (texts[i], tokens.get(i, []), finish.get(i, "")) for i in texts}, usage


def http_chat(srv, body):
    """(status, parsed body) of POST /v1/chat/completions."""
    req = urllib.request.Request(srv.base_url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class ChatStories(unittest.TestCase):
    """stories260K with a ChatML template file (--chat-template), as test_openai's server."""

    @classmethod
    def setUpClass(cls):
        cls.srv = ArborServer(["--kv-blocks", "512", "--chat-template", CHATML,
                               "--default-max-tokens", str(DEFAULT_MAX_TOKENS)]).start()
        try:
            cls.channel = channel(cls.srv)
        except Exception:
            cls.srv.stop()
            raise
        cls.stub = test_grpc.pb_grpc.ArborStub(cls.channel)
        with open(CHATML) as f:
            cls.template = f.read()

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.srv.stop()
        assert code == 0, f"server exited with {code}:\n{cls.srv.output()}"

    def rendered_ids(self, messages):
        """Token ids of the jinja2 rendering, tokenized as a chat prompt (no BOS added)."""
        text = render_jinja2(self.template, messages)
        r = self.stub.Tokenize(pb().TokenizeRequest(text=text, add_bos=False), timeout=10)
        return list(r.token_ids)

    def test_greedy_chat_equals_generate_of_the_jinja2_rendering_and_http_chat(self):
        for messages in CONVERSATIONS:
            ids = self.rendered_ids(messages)
            gen = self.stub.Generate(pb().GenerateRequest(
                token_ids=pb().TokenIds(ids=ids), max_tokens=32, temperature=0, logprobs=0),
                timeout=60)
            chat = self.stub.Chat(chat_request(messages, max_tokens=32, temperature=0,
                                               logprobs=0), timeout=60)
            streamed, usage = stream_chat(self.stub, chat_request(messages, max_tokens=32,
                                                                  temperature=0), timeout=60)
            code, http = http_chat(self.srv, {"messages": messages, "max_tokens": 32,
                                              "temperature": 0, "logprobs": True,
                                              "top_logprobs": 0})
            self.assertEqual(code, 200, http)
            g, c = gen.choices[0], chat.choices[0]
            self.assertGreater(len(c.token_ids), 0)
            self.assertEqual(chat.model, MODEL)
            self.assertTrue(chat.id.startswith("chat-"), chat.id)
            # The same tokens as Generate on the jinja2 rendering...
            self.assertEqual(list(c.token_ids), list(g.token_ids), messages)
            self.assertEqual(c.text, g.text)
            self.assertEqual(c.finish_reason, g.finish_reason)
            self.assertEqual(chat.usage.prompt_tokens, len(ids))
            self.assertEqual(chat.usage.completion_tokens, len(c.token_ids))
            self.assertEqual([lp.token for lp in c.logprobs], list(c.token_ids))
            # (Not bit-equal: the second run reads the prompt from the prefix cache.)
            for a, b in zip(c.logprobs, g.logprobs):
                self.assertAlmostEqual(a.logprob, b.logprob, places=4)
            # ... as the stream ...
            self.assertEqual(streamed[0], (c.text, list(c.token_ids), c.finish_reason))
            self.assertEqual(usage.prompt_tokens, len(ids))
            self.assertEqual(usage.completion_tokens, chat.usage.completion_tokens)
            # ... and as HTTP chat: text, usage and each token's bytes.
            h = http["choices"][0]
            self.assertEqual(h["message"]["content"], c.text)
            self.assertEqual(h["finish_reason"], c.finish_reason)
            self.assertEqual(http["usage"]["prompt_tokens"], len(ids))
            self.assertEqual(http["usage"]["completion_tokens"], len(c.token_ids))
            self.assertEqual([bytes(t["bytes"]) for t in h["logprobs"]["content"]],
                             [lp.piece for lp in c.logprobs])

    def test_developer_role_and_name_as_http(self):
        messages = [{"role": "developer", "content": "Be brief."},
                    {"role": "user", "content": "Hi", "name": "ben"}]
        as_system = [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"}]
        chat = self.stub.Chat(chat_request(messages, max_tokens=16, temperature=0), timeout=60)
        ref = self.stub.Generate(pb().GenerateRequest(
            token_ids=pb().TokenIds(ids=self.rendered_ids(as_system)), max_tokens=16,
            temperature=0), timeout=60)
        _, http = http_chat(self.srv, {"messages": messages, "max_tokens": 16, "temperature": 0})
        self.assertEqual(list(chat.choices[0].token_ids), list(ref.choices[0].token_ids))
        self.assertEqual(chat.choices[0].text, http["choices"][0]["message"]["content"])

    def test_default_max_tokens_as_http(self):
        messages = CONVERSATIONS[1]
        chat = self.stub.Chat(chat_request(messages, temperature=0, ignore_eos=True), timeout=60)
        _, http = http_chat(self.srv, {"messages": messages, "temperature": 0,
                                       "ignore_eos": True})
        self.assertEqual(chat.usage.completion_tokens, DEFAULT_MAX_TOKENS)
        self.assertEqual(http["usage"]["completion_tokens"], DEFAULT_MAX_TOKENS)
        self.assertEqual(chat.choices[0].finish_reason, "length")
        self.assertEqual(chat.choices[0].text, http["choices"][0]["message"]["content"])
        # A conversation that leaves less room than the default gets what fits.
        long = self.conversation_leaving(10)
        chat = self.stub.Chat(chat_request(long, temperature=0, ignore_eos=True), timeout=60)
        self.assertEqual(chat.usage.completion_tokens, 10)

    def conversation_leaving(self, room):
        """A one-message conversation whose rendering leaves `room` tokens of the context."""
        max_context = self.stub.GetModelInfo(pb().ModelInfoRequest(), timeout=10).max_context
        words = 100
        for _ in range(10):
            messages = [{"role": "user", "content": "a" + " a" * words}]
            left = max_context - len(self.rendered_ids(messages))
            if left == room:
                return messages
            words += left - room
        self.fail(f"no conversation leaves {room} tokens")

    def test_sampling_and_stop_options_as_generate(self):
        messages = CONVERSATIONS[1]
        ids = pb().TokenIds(ids=self.rendered_ids(messages))
        options = [
            dict(max_tokens=40, temperature=0, stop=["."]),
            dict(max_tokens=20, temperature=0.9, seed=7, n=3),
            dict(max_tokens=20, temperature=0.8, top_p=0.9, top_k=40, min_p=0.05, seed=3,
                 presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2),
            dict(max_tokens=12, temperature=0, logit_bias={300: 100.0}),
            dict(max_tokens=12, temperature=0, logprobs=3),
        ]
        for kw in options:
            chat = self.stub.Chat(chat_request(messages, **kw), timeout=60)
            gen = self.stub.Generate(pb().GenerateRequest(token_ids=ids, **kw), timeout=60)
            self.assertEqual(len(chat.choices), kw.get("n", 1))
            for c, g in zip(chat.choices, gen.choices):
                self.assertEqual((c.index, c.text, list(c.token_ids), c.finish_reason),
                                 (g.index, g.text, list(g.token_ids), g.finish_reason), kw)
                self.assertEqual([(lp.token, len(lp.top)) for lp in c.logprobs],
                                 [(lp.token, len(lp.top)) for lp in g.logprobs], kw)
            if "stop" in kw:
                self.assertEqual(chat.choices[0].finish_reason, "stop")
                self.assertNotIn(".", chat.choices[0].text)
            if "logit_bias" in kw:
                self.assertEqual(set(chat.choices[0].token_ids), {300})

    def test_invalid_requests_answer_with_codes_and_http_messages(self):
        info = self.stub.GetModelInfo(pb().ModelInfoRequest(), timeout=10)
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        hi = [{"role": "user", "content": "Hi"}]
        # (messages, fields, code, needle, the HTTP body's message is the same)
        cases = [
            ([], {}, invalid, "'messages'", False),
            ([{"role": "robot", "content": "x"}], {}, invalid, "'messages[0].role'", True),
            (hi + [{"role": "tool", "content": "x"}], {}, invalid, "'messages[1].role'", True),
            ([{"role": "", "content": "x"}], {}, invalid, "'messages[0].role'", True),
            ([{"role": "User", "content": "x"}], {}, invalid, "'messages[0].role'", True),
            (hi, {"stop": ["a"] * 17}, invalid, "'stop' holds at most 16", True),
            (hi, {"stop": [""]}, invalid, "'stop' strings", True),
            (hi, {"stop": ["x" * 257]}, invalid, "'stop' strings are at most 256", True),
            (hi, {"max_tokens": 0}, invalid, "max_tokens", True),
            (hi, {"max_tokens": info.max_context}, invalid, "max_tokens", True),
            (hi, {"temperature": 3}, invalid, "temperature", True),
            (hi, {"top_p": 0}, invalid, "top_p", True),
            (hi, {"n": 0}, invalid, "'n' must", True),
            (hi, {"n": 1000}, invalid, "'n' must", True),
            (hi, {"logprobs": 21}, invalid, "logprobs", False),
            (hi, {"logprobs": -1}, invalid, "logprobs", False),
            (hi, {"logit_bias": {512: 1.0}}, invalid, "logit_bias", True),
            (hi, {"speculate": True}, invalid, "speculat", True),
            ([{"role": "user", "content": "a b c d " * 400}], {}, invalid, "context length",
             True),
            (hi, {"model": "gpt-4"}, grpc.StatusCode.NOT_FOUND, "gpt-4", False),
        ]
        for messages, fields, code, needle, same_as_http in cases:
            req = chat_request(messages, **fields)
            for rpc in (self.stub.Chat, lambda r, **kw: list(self.stub.ChatStream(r, **kw))):
                with self.assertRaises(grpc.RpcError, msg=str(req)) as cm:
                    rpc(req, timeout=30)
                self.assertEqual(cm.exception.code(), code, f"{fields}: {cm.exception.details()}")
                self.assertIn(needle, cm.exception.details(), fields)
            if same_as_http:
                status, body = http_chat(self.srv, {"messages": messages, **fields})
                self.assertEqual(status, 400, body)
                self.assertEqual(body["error"]["message"], cm.exception.details(), fields)
        # Still serving, nothing leaked.
        self.assertGreater(self.stub.Chat(chat_request(hi, max_tokens=2)).usage.completion_tokens,
                           0)
        wait_for_free_blocks(self, self.srv)

    def test_cancelled_chat_stream_frees_blocks(self):
        req = chat_request(CONVERSATIONS[0], max_tokens=300, ignore_eos=True, temperature=0.8)
        calls = [self.stub.ChatStream(req) for _ in range(8)]
        for call in calls:
            next(call)
        for call in calls:
            call.cancel()
        wait_for_free_blocks(self, self.srv)
        for call in calls:
            self.assertEqual(call.code(), grpc.StatusCode.CANCELLED)


class ChatWithoutTemplate(unittest.TestCase):
    def test_failed_precondition_and_api_key(self):
        # stories260K's tokenizer (tok512.bin) has no chat template.
        with ArborServer(["--api-key", "k"]) as srv, channel(srv) as ch:
            stub = test_grpc.pb_grpc.ArborStub(ch)
            req = chat_request([{"role": "user", "content": "Hi"}], max_tokens=2)
            with self.assertRaises(grpc.RpcError) as cm:
                stub.Chat(req, timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            good = (("authorization", "Bearer k"),)
            for rpc in (stub.Chat, lambda r, **kw: list(stub.ChatStream(r, **kw))):
                with self.assertRaises(grpc.RpcError) as cm:
                    rpc(req, metadata=good, timeout=10)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("chat template", cm.exception.details())


class Reflection(unittest.TestCase):
    """Server reflection read by grpcio-reflection's client, as grpcurl and GUI clients do."""

    def test_services_and_chat_described_and_callable(self):
        from google.protobuf import descriptor_pb2, descriptor_pool
        from google.protobuf.message_factory import GetMessageClass
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase)
        # With an API key: reflection (like health) answers without it.
        with ArborServer(["--chat-template", CHATML, "--api-key", "k"]) as srv, \
                channel(srv) as ch:
            db = ProtoReflectionDescriptorDatabase(ch)
            services = set(db.get_services())
            self.assertLessEqual({"arbor.v1.Arbor", "grpc.health.v1.Health",
                                  "grpc.reflection.v1alpha.ServerReflection"}, services)
            pool = descriptor_pool.DescriptorPool(db)
            arbor = pool.FindServiceByName("arbor.v1.Arbor")
            self.assertLessEqual({"Generate", "GenerateStream", "Chat", "ChatStream", "Tokenize",
                                  "GetModelInfo"}, {m.name for m in arbor.methods})
            chat = arbor.FindMethodByName("Chat")
            self.assertEqual(chat.input_type.full_name, "arbor.v1.ChatRequest")
            self.assertEqual(chat.output_type.full_name, "arbor.v1.ChatResponse")
            self.assertEqual(arbor.FindMethodByName("ChatStream").output_type.full_name,
                             "arbor.v1.ChatStreamResponse")
            # The server describes the file this checkout's proto/arbor.proto compiles to.
            served, local = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
            chat.containing_service.file.CopyToProto(served)
            pb().DESCRIPTOR.CopyToProto(local)
            self.assertEqual(served, local)
            # The health service resolves too (gRPC's built-in one has no descriptor of its own).
            health = pool.FindServiceByName("grpc.health.v1.Health")
            self.assertEqual(health.FindMethodByName("Check").input_type.full_name,
                             "grpc.health.v1.HealthCheckRequest")
            # A client that knows only what reflection told it calls Chat.
            request_cls = GetMessageClass(chat.input_type)
            response_cls = GetMessageClass(chat.output_type)
            req = request_cls()
            m = req.messages.add()
            m.role, m.content = "user", "Hi"
            req.max_tokens, req.temperature = 8, 0.0
            call = ch.unary_unary("/arbor.v1.Arbor/Chat",
                                  request_serializer=request_cls.SerializeToString,
                                  response_deserializer=response_cls.FromString)
            good = (("authorization", "Bearer k"),)
            dynamic = call(req, metadata=good, timeout=60)
            stub = test_grpc.pb_grpc.ArborStub(ch)
            typed = stub.Chat(chat_request([{"role": "user", "content": "Hi"}], max_tokens=8,
                                           temperature=0), metadata=good, timeout=60)
            self.assertEqual(list(dynamic.choices[0].token_ids), list(typed.choices[0].token_ids))
            self.assertEqual(dynamic.choices[0].text, typed.choices[0].text)


class SmolLM2Chat(unittest.TestCase):
    """The default model with its GGUF's own chat template, against Python jinja2."""

    def test_chat_equals_generate_of_the_jinja2_rendering(self):
        import gguf
        reader = gguf.GGUFReader(SMOLLM2)
        field = reader.fields["tokenizer.chat_template"]
        template = bytes(field.parts[field.data[0]]).decode()
        messages = [{"role": "system", "content": "You are a concise assistant."},
                    {"role": "user", "content": "What is the capital of France?"}]
        rendered = render_jinja2(template, messages, bos="<|im_start|>", eos="<|im_end|>")
        with ArborServer([], model=SMOLLM2) as srv, channel(srv) as ch:
            stub = test_grpc.pb_grpc.ArborStub(ch)
            ids = list(stub.Tokenize(pb().TokenizeRequest(text=rendered, add_bos=False),
                                     timeout=30).token_ids)
            start = time.time()
            chat = stub.Chat(chat_request(messages, max_tokens=12, temperature=0), timeout=300)
            gen = stub.Generate(pb().GenerateRequest(token_ids=pb().TokenIds(ids=ids),
                                                     max_tokens=12, temperature=0), timeout=300)
            _, http = http_chat(srv, {"messages": messages, "max_tokens": 12, "temperature": 0})
            self.assertLess(time.time() - start, 300)
        self.assertEqual(chat.usage.prompt_tokens, len(ids))
        self.assertEqual(list(chat.choices[0].token_ids), list(gen.choices[0].token_ids))
        self.assertEqual(chat.choices[0].text, http["choices"][0]["message"]["content"])
        self.assertIn("Paris", chat.choices[0].text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
